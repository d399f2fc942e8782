from apexrl.launcher.cli import entry

entry()
