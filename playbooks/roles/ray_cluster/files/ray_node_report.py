#!/usr/bin/env python3
"""What must be identical on every host of a Ray cluster, as one JSON object; changes nothing.

Reads the venv's Python version (pyvenv.cfg) and package versions (dist-info metadata, without
running the venv's interpreter, so it works before the venv exists), and the GPU driver version
and GPU names from nvidia-smi unless --no-gpu.

Exit: 0 after a report (missing things are reported as null), 2 on bad arguments.
Example:
  ray_node_report.py --venv /opt/glm5/venv --package vllm --package ray
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shlex
import subprocess
from pathlib import Path


def venv_report(venv: Path, packages: list[str]) -> dict:
    cfg = venv / "pyvenv.cfg"
    python = None
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            m = re.match(r"\s*version(?:_info)?\s*=\s*(\d+\.\d+)", line)
            if m:
                python = m.group(1)
                break
    site = sorted(venv.glob("lib/python3*/site-packages"))
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(p) for p in site]):
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        found.setdefault(name, dist.version)
    versions = {p: found.get(re.sub(r"[-_.]+", "-", p).lower()) for p in packages}
    return {"python": python, "packages": versions}


def gpu_report(nvidia_smi: str) -> dict:
    cmd = [*shlex.split(nvidia_smi), "--query-gpu=driver_version,name", "--format=csv,noheader"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"driver_branch": None, "gpus": [], "gpu_error": str(exc).splitlines()[0]}
    rows = [[c.strip() for c in line.split(",", 1)] for line in out.splitlines() if line.strip()]
    drivers = sorted({r[0] for r in rows})
    branch = ",".join(sorted({d.split(".")[0] for d in drivers})) or None
    return {"driver_branch": branch, "gpus": [r[1] for r in rows if len(r) == 2], "gpu_error": None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="the vLLM venv")
    parser.add_argument("--package", action="append", default=[], help="distribution name")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="nvidia-smi command")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU query")
    args = parser.parse_args(argv)
    report = venv_report(args.venv, args.package)
    if not args.no_gpu:
        report.update(gpu_report(args.nvidia_smi))
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
