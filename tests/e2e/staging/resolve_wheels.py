"""Download the wheels that vLLM needs but the H200 image lacks (or has at a wrong version).

Adapted from the workplace's shared device-vllm recipe. Walks Requires-Dist transitively, one
`pip download --no-deps` per package, for CPython 3.12 manylinux x86_64, and skips packages the
image already has at a version that satisfies the requirement (read from a `pip list
--format=freeze` file, --freeze) and packages named in --skip (heavy GPU extras that the
Triton/MLA path goes without). The vLLM wheel itself is taken from --have. Writes
DEST/resolve.log with one line per decision.

    python resolve_wheels.py --freeze h200-freeze.txt --dest DIR --have VLLM_DIR \\
        --skip flashinfer-python,torch 'transformers==5.5.4' 'vllm==0.23.0'
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

PLATFORMS = [
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
    "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
    "manylinux_2_5_x86_64", "linux_x86_64",
]  # fmt: skip

ENV: dict[str, str] = dict(default_environment())
ENV.update(
    {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
    }
)


def read_freeze(path: Path) -> dict[str, str]:
    installed = {}
    for line in path.read_text().splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            installed[canonicalize_name(name)] = version.strip()
    return installed


def wheel_for(dest: Path, name: str) -> tuple[Path | None, object]:
    cn = canonicalize_name(name)
    for p in dest.glob("*.whl"):
        try:
            n, v, _, _ = parse_wheel_filename(p.name)
        except Exception:  # noqa: S112  (a foreign file name: not a wheel of ours)
            continue
        if canonicalize_name(n) == cn:
            return p, v
    return None, None


def requires(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        meta = [m for m in z.namelist() if m.endswith(".dist-info/METADATA")][0]
        text = z.read(meta).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def download(dest: Path, spec: str) -> tuple[int, list[str]]:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
           "--abi", "abi3", "--abi", "none"]  # fmt: skip
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += ["--platform", "any", "-d", str(dest), spec]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stderr.strip().splitlines()[-1:] if r.returncode else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--freeze", required=True, type=Path, help="pip freeze of the GPU image")
    ap.add_argument("--dest", required=True, type=Path, help="folder for the wheels")
    ap.add_argument("--skip", default="", help="comma-separated names not to carry")
    ap.add_argument("--have", type=Path, help="folder with wheels already downloaded (vllm)")
    ap.add_argument("roots", nargs="+", help="root requirements")
    a = ap.parse_args(argv)
    a.dest.mkdir(parents=True, exist_ok=True)
    installed = read_freeze(a.freeze)
    skip = {canonicalize_name(s) for s in a.skip.split(",") if s}
    failed = 0
    with open(a.dest / "resolve.log", "w") as log:
        queue = [(Requirement(r), "root") for r in a.roots]
        seen: dict[str, object] = {}
        while queue:
            req, parent = queue.pop(0)
            if req.marker is not None and not req.marker.evaluate({**ENV, "extra": ""}):
                continue
            cn = canonicalize_name(req.name)
            if cn in skip:
                print(f"SKIP   {req} (from {parent})", file=log)
                continue
            if cn in seen:
                v = seen[cn]
                if req.specifier and not req.specifier.contains(str(v), prereleases=True):
                    print(f"CONFLICT {req} (from {parent}) vs chosen {v}", file=log)
                continue
            have = installed.get(cn)
            if have is not None and (
                not req.specifier or req.specifier.contains(have, prereleases=True)
            ):
                print(f"IMAGE  {req} ok: image has {have} (from {parent})", file=log)
                continue
            why = f"image has {have}" if have is not None else "missing on image"
            whl, ver = wheel_for(a.have, req.name) if a.have else (None, None)
            if whl is None:
                spec = f"{req.name}{req.specifier}"
                whl, ver = wheel_for(a.dest, req.name)
                if whl is None or not req.specifier.contains(str(ver), prereleases=True):
                    rc, err = download(a.dest, spec)
                    if rc:
                        print(f"FAIL   {spec} (from {parent}): {err}", file=log)
                        failed += 1
                        continue
                    whl, ver = wheel_for(a.dest, req.name)
            assert whl is not None
            seen[cn] = ver
            print(f"CARRY  {req.name}=={ver} [{why}] (from {parent}) {whl.name}", file=log)
            extras = set(req.extras)
            for r in requires(whl):
                rr = Requirement(r)
                if rr.marker is not None:
                    if not any(rr.marker.evaluate({**ENV, "extra": e}) for e in (extras or {""})):
                        continue
                    rr.marker = None
                queue.append((rr, req.name))
    print((a.dest / "resolve.log").read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
