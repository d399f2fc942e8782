"""Another commit of apexrl, importable beside this checkout, for a benchmark that compares two versions in one run.

`git archive REF` is unpacked into a directory, next to an `apexrl/` package whose subpackages are symlinks to the
unpacked folders (pyproject.toml's package-dir at REF says which). Put first on a child process's PYTHONPATH, that
package is what the child imports: the editable install's finder comes after the path entries. This process keeps
importing the checkout, and nothing in the working tree or the repository changes.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def describe(ref: str) -> str:
    """The abbreviated commit `ref` names (ValueError when it names none)."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ValueError(f"--baseline {ref!r} names no commit of {ROOT}: {done.stderr.strip()}")
    return done.stdout.strip()


def baseline_pythonpath(ref: str, workdir: Path) -> str:
    """Unpack commit `ref` under `workdir`; return the directory to put first on a child's PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", describe(ref)], capture_output=True, check=True
    ).stdout
    source = workdir / "source"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    package_dirs = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = workdir / "path" / "apexrl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, folder in package_dirs.items():
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == "apexrl":  # subpackages of subpackages come with their parent
            (package / parts[1]).symlink_to(source / folder, target_is_directory=True)
    return str(workdir / "path")


def imported_from(module: str, env: dict[str, str], cwd: str) -> Path:
    """The file a child started with `env` in `cwd` imports for `module` (to check which code a server runs)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module} as m; print(m.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())
