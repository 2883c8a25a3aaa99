#!/usr/bin/env python3
"""Read-only facts for the preflight role, printed as one JSON object.

Reads PCI devices from sysfs (works before any NVIDIA driver exists), asks nvidia-smi when it
is there, reads the Secure Boot EFI variable, the free space below a path, and whether any of
the given files is held by a dpkg-style fcntl lock. Changes nothing (the lock test takes and
drops a non-blocking lock only when the file is free). Exit 0 always unless the input is bad.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

NVIDIA_VENDOR = "0x10de"


def pci_gpus(root: Path) -> list[str]:
    found = []
    if not root.is_dir():
        return found
    for dev in sorted(root.iterdir()):
        try:
            vendor = (dev / "vendor").read_text().strip()
            klass = (dev / "class").read_text().strip()
        except OSError:
            continue
        # 0x0300xx VGA, 0x0302xx 3D controller (data-centre / headless cards)
        if vendor == NVIDIA_VENDOR and klass[:6] in ("0x0300", "0x0302"):
            found.append(dev.name)
    return found


def nvidia_smi(binary: str) -> dict:
    path = shutil.which(binary)
    if path is None:
        return {"present": False, "gpus": [], "error": f"{binary} not found"}
    query = "--query-gpu=index,name,compute_cap,driver_version,memory.total"
    try:
        out = subprocess.run(
            [path, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"present": True, "gpus": [], "error": str(exc)}
    if out.returncode != 0:
        return {"present": True, "gpus": [], "error": (out.stderr or out.stdout).strip()}
    gpus = []
    for line in out.stdout.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 5:
            gpus.append(
                dict(
                    zip(
                        ("index", "name", "compute_cap", "driver", "memory_mib"),
                        fields[:5],
                        strict=True,
                    )
                )
            )
    return {"present": True, "gpus": gpus, "error": ""}


def secure_boot(efivar: Path) -> str:
    try:
        data = efivar.read_bytes()
    except FileNotFoundError:
        return "unsupported"  # legacy BIOS or no efivarfs: no Secure Boot
    except OSError:
        return "unknown"
    # efivarfs: 4 bytes of attributes, then the value byte
    return "enabled" if len(data) >= 5 and data[4] == 1 else "disabled"


def free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def locked(files: list[str]) -> list[str]:
    held = []
    for name in files:
        try:
            fd = os.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            # dpkg/apt use fcntl (POSIX) write locks; F_GETLK-style test via lockf needs a
            # writable fd, so test with a shared read lock, which conflicts with their write lock.
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        except OSError:
            held.append(name)
        finally:
            os.close(fd)
    return held


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pci-dir", type=Path, default=Path("/sys/bus/pci/devices"))
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--secure-boot-var", type=Path, required=True)
    p.add_argument("--space-path", type=Path, required=True)
    p.add_argument("--lock-file", action="append", default=[])
    p.add_argument("--only-locks", action="store_true", help="report the lock state only")
    args = p.parse_args(argv)
    if args.only_locks:
        print(json.dumps({"locked": locked(args.lock_file)}))
        return 0
    facts = {
        "pci_gpus": pci_gpus(args.pci_dir),
        "nvidia_smi": nvidia_smi(args.nvidia_smi),
        "secure_boot": secure_boot(args.secure_boot_var),
        "free_bytes": free_bytes(args.space_path),
        "locked": locked(args.lock_file),
    }
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
