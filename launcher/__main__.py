import sys

from apexrl.launcher.cli import main

sys.exit(main())
