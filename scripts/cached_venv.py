"""Build a cached virtual environment once, under a lock, and publish it atomically.

DEST (e.g. ~/.cache/glm5-sm120/runtime-<hash>) is ready when DEST/.installed exists; then this
does nothing. Otherwise it takes DEST.lock (flock: a second clone waits instead of wiping a build
in progress), builds the venv in a fresh directory DEST.builds/<id> (pip install -r REQ, pip
check, stamp), and points the symlink DEST at it with one rename. A venv cannot move once its
scripts carry its path, hence the symlink. A failed build leaves nothing; an unfinished one
from a killed run is removed by the next builder, which holds the lock.

Exit: 0 ready, 1 the build failed (pip's output above the error line), 2 usage error.
Examples:
  cached_venv.py --python python3.11 --requirements requirements/runtime.in \\
      ~/.cache/glm5-sm120/runtime-c938be5ad905
  PIP_NO_INDEX=1 cached_venv.py --requirements req.txt /tmp/env     # offline, local wheels
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cli_args

STAMP = ".installed"


def ready(dest: Path) -> bool:
    return (dest / STAMP).is_file()


def _build(python: str, requirements: Path, build: Path) -> None:
    pip = [str(build / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run([python, "-m", "venv", str(build)], check=True)
    subprocess.run([*pip, "install", "-q", "-r", str(requirements)], check=True)
    subprocess.run([*pip, "check"], check=True)
    (build / STAMP).write_text(f"{requirements.resolve()}\n")


def ensure(dest: Path, requirements: Path, python: str) -> Path:
    """Return DEST once it is a ready venv, building it if no one has."""
    if ready(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    builds = dest.with_name(dest.name + ".builds")
    with open(dest.with_name(dest.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build of {dest} (lock {lock.name})", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if ready(dest):  # built by whoever held the lock
            return dest
        # Holding the lock: nothing else is building, so leftovers are from killed runs.
        if dest.is_symlink() or dest.exists():
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)
            else:
                dest.unlink()
        if builds.is_dir():
            for old in builds.iterdir():
                if not ready(old):
                    shutil.rmtree(old, ignore_errors=True)
        builds.mkdir(exist_ok=True)
        build = builds / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        try:
            _build(python, requirements, build)
            link = dest.with_name(f".{dest.name}.link-{os.getpid()}")
            link.unlink(missing_ok=True)
            link.symlink_to(build.relative_to(dest.parent))
            os.replace(link, dest)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = cli_args.parser(__doc__)
    parser.add_argument("dest", type=Path, help="where the venv is reached (a symlink)")
    parser.add_argument(
        "--requirements", type=Path, required=True, help="pip requirements file to install"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter of the venv (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if not args.requirements.is_file():
        parser.error(f"no requirements file {args.requirements}")
    if shutil.which(args.python) is None:
        parser.error(f"no Python {args.python}")
    try:
        ensure(args.dest, args.requirements, args.python)
    except subprocess.CalledProcessError as exc:
        print(
            f"error: building {args.dest} failed: {' '.join(exc.cmd)} exited {exc.returncode}",
            file=sys.stderr,
        )
        return 1
    print(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
