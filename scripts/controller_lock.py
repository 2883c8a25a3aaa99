"""Lock the controller requirements for every supported Python with pip's own resolver.

Resolves requirements/controller.in once per Python version (`pip install --dry-run --report`,
wheels only, nothing installed) and writes requirements/controller.txt when every version
resolves to the same set; otherwise writes nothing and names the versions and pins that differ.

Exit: 0 written, 1 the resolutions differ or pip failed, 2 usage error.
Examples:
  controller_lock.py                                  # 3.11, 3.12 and 3.13 (make lock)
  controller_lock.py --python-version 3.12 --output /tmp/lock.txt
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import cli_args
from safe_files import write_atomic

REPO = Path(__file__).resolve().parent.parent
VERSIONS = ["3.11", "3.12", "3.13"]


def resolve(requirements: Path, version: str, scratch: Path) -> list[str]:
    report = scratch / f"{version}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--dry-run",
            "--ignore-installed",
            "--only-binary=:all:",
            "--python-version",
            version,
            "--target",
            str(scratch / f"target-{version}"),
            "--report",
            str(report),
            "-r",
            str(requirements),
        ],
        check=True,
    )
    items = json.loads(report.read_text())["install"]
    pins = {i["metadata"]["name"]: i["metadata"]["version"] for i in items}
    # pip freeze's order (by name), so a re-lock of the same set keeps the file's bytes
    return [f"{name}=={pins[name]}" for name in sorted(pins, key=str.lower)]


def main(argv: list[str] | None = None) -> int:
    parser = cli_args.parser(__doc__)
    parser.add_argument(
        "--requirements",
        type=Path,
        default=REPO / "requirements/controller.in",
        help="direct pins (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO / "requirements/controller.txt",
        help="the lock (default: %(default)s)",
    )
    parser.add_argument(
        "--python-version",
        action="append",
        dest="versions",
        help=f"repeatable (default: {' '.join(VERSIONS)})",
    )
    args = parser.parse_args(argv)
    versions = args.versions or VERSIONS
    with tempfile.TemporaryDirectory() as scratch:
        try:
            sets = {v: resolve(args.requirements, v, Path(scratch)) for v in versions}
        except subprocess.CalledProcessError as exc:
            print(
                f"error: pip could not resolve {args.requirements}: exit {exc.returncode}",
                file=sys.stderr,
            )
            return 1
    first = sets[versions[0]]
    for version, pins in sets.items():
        if pins != first:
            diff = sorted(set(pins) ^ set(first))
            print(
                f"error: Python {version} resolves differently from {versions[0]}: "
                f"{', '.join(diff)}; lock per version",
                file=sys.stderr,
            )
            return 1
    header = (
        f"# Generated from controller.in by make lock (scripts/controller_lock.py): one "
        f"resolution, identical for Python {', '.join(versions)}.\n"
    )
    write_atomic(args.output, (header + "\n".join(first) + "\n").encode())
    print(f"{args.output}: {len(first)} pins, Python {', '.join(versions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
