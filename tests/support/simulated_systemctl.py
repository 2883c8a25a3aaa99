"""Simulated systemctl for test hosts whose PID 1 is not systemd (test-only).

The CI machine is a VM whose PID 1 is not systemd, so the Ray units the playbook installs
cannot be started by systemd there. Each simulated host (a network namespace with its own
mount namespace) gets this script bind-mounted over /usr/bin/systemctl. It implements the
calls ansible.builtin.systemd_service and the fabfile make (daemon-reload, show, is-active,
is-enabled, enable, disable, start, stop, restart, status) and runs the unit's real
ExecStart= with its Environment=, EnvironmentFile=, User=, Group= and WorkingDirectory= in a
fresh cgroup, so that `stop` ends every process the service started the way KillMode=mixed
does: SIGTERM to the main process, then SIGKILL to whatever is left in the cgroup after
TimeoutStopSec=. Restart= is not emulated.

Usage: simulated_systemctl.py --state-dir DIR [--unit-dir DIR] COMMAND [UNIT] [options]
       simulated_systemctl.py --state-dir DIR kill-all     (test teardown)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

CGROUP_BASES = [Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")]


def parse_unit(path: Path) -> dict[str, list[str]]:
    """Return {"Section.Key": [values...]} with line continuations joined."""
    out: dict[str, list[str]] = {}
    section = ""
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def unit_env(unit: dict[str, list[str]]) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
    }
    for item in unit.get("Service.Environment", []):
        for pair in shlex.split(item):
            key, _, value = pair.partition("=")
            env[key] = value
    for item in unit.get("Service.EnvironmentFile", []):
        optional = item.startswith("-")
        path = Path(item.lstrip("-"))
        if not path.exists() and optional:
            continue
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"').strip("'")
    return env


class Units:
    def __init__(self, state_dir: Path, unit_dir: Path) -> None:
        self.state_dir = state_dir
        self.unit_dir = unit_dir
        state_dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def name(unit: str) -> str:
        return unit if "." in unit else f"{unit}.service"

    def path(self, unit: str) -> Path:
        return self.unit_dir / self.name(unit)

    def record(self, unit: str) -> Path:
        return self.state_dir / f"{self.name(unit)}.json"

    def enabled(self, unit: str) -> bool:
        return (self.state_dir / f"{self.name(unit)}.enabled").exists()

    def main_pid(self, unit: str) -> int:
        try:
            return int(json.loads(self.record(unit).read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return 0

    def active_state(self, unit: str) -> str:
        pid = self.main_pid(unit)
        if not pid:
            return "inactive"
        return "active" if alive(pid) else "failed"

    def show(self, unit: str) -> str:
        name = self.name(unit)
        if not self.path(unit).exists():
            return f"Id={name}\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n"
        state = self.active_state(unit)
        sub = {"active": "running", "failed": "failed"}.get(state, "dead")
        desc = parse_unit(self.path(unit)).get("Unit.Description", [""])[0]
        pid = self.main_pid(unit) if state == "active" else 0
        return (
            f"Id={name}\nNames={name}\nDescription={desc}\nLoadState=loaded\n"
            f"ActiveState={state}\nSubState={sub}\nMainPID={pid}\n"
            f"UnitFileState={'enabled' if self.enabled(unit) else 'disabled'}\n"
            f"FragmentPath={self.path(unit)}\n"
        )

    def start(self, unit: str) -> int:
        if self.active_state(unit) == "active":
            return 0
        if not self.path(unit).exists():
            print(f"Failed to start {self.name(unit)}: Unit not found.", file=sys.stderr)
            return 5
        spec = parse_unit(self.path(unit))
        argv = shlex.split(spec["Service.ExecStart"][-1])
        user = spec.get("Service.User", ["root"])[-1]
        group = spec.get("Service.Group", [None])[-1]
        cwd = spec.get("Service.WorkingDirectory", ["/"])[-1]
        cgroup = make_cgroup(f"{self.state_dir.name}-{self.name(unit)}-{time.time_ns()}")
        log = open(self.state_dir / f"{self.name(unit)}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            argv,
            env=unit_env(spec),
            cwd=cwd,
            user=None if user == "root" else user,
            group=group if group and user != "root" else None,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if cgroup:  # joined from here: a child that has dropped to User= may not write cgroups
            join_cgroup(cgroup, proc.pid)
        rec = {"pid": proc.pid, "cgroup": str(cgroup) if cgroup else None}
        self.record(unit).write_text(json.dumps(rec))
        return 0

    def stop(self, unit: str) -> int:
        rec_path = self.record(unit)
        if not rec_path.exists():
            return 0
        rec = json.loads(rec_path.read_text())
        timeout = 90.0
        if self.path(unit).exists():
            value = parse_unit(self.path(unit)).get("Service.TimeoutStopSec", ["90"])[-1]
            timeout = float(value.rstrip("s"))
        terminate(int(rec["pid"]), Path(rec["cgroup"]) if rec.get("cgroup") else None, timeout)
        rec_path.unlink()
        return 0


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def make_cgroup(name: str) -> Path | None:
    for base in CGROUP_BASES:
        if (base / "cgroup.procs").exists():
            try:
                (base / name).mkdir()
            except OSError:
                continue
            return base / name
    return None


def join_cgroup(cgroup: Path, pid: int) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


def cgroup_pids(cgroup: Path | None) -> list[int]:
    if cgroup is None or not cgroup.exists():
        return []
    return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]


def terminate(pid: int, cgroup: Path | None, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    for _ in range(50):
        left = [p for p in cgroup_pids(cgroup) if alive(p)] or ([pid] if alive(pid) else [])
        if not left:
            break
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.1)
    if cgroup is not None:
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--unit-dir", type=Path, default=Path("/etc/systemd/system"))
    parser.add_argument("command")
    parser.add_argument("units", nargs="*")
    args, _ignored = parser.parse_known_args(argv)  # --no-block, --system, -l, ...
    units = Units(args.state_dir, args.unit_dir)
    names = [u.strip("'") for u in args.units]
    cmd = args.command
    if cmd in ("daemon-reload", "daemon-reexec"):
        return 0
    if cmd == "kill-all":
        for rec in args.state_dir.glob("*.json"):
            data = json.loads(rec.read_text())
            terminate(int(data["pid"]), Path(data["cgroup"]) if data.get("cgroup") else None, 30)
            rec.unlink()
        return 0
    if cmd in ("show", "status"):
        for unit in names:
            sys.stdout.write(units.show(unit))
        return 0 if all(units.active_state(u) == "active" for u in names) or cmd == "show" else 3
    if cmd == "is-active":
        states = [units.active_state(u) for u in names]
        print("\n".join(states))
        return 0 if all(s == "active" for s in states) else 3
    if cmd == "is-enabled":
        rc = 0
        for unit in names:
            if not units.path(unit).exists():
                name = units.name(unit)
                print(f"Failed to get unit file state for {name}: No such file or directory")
                rc = 1
                continue
            print("enabled" if units.enabled(unit) else "disabled")
            rc = rc or (0 if units.enabled(unit) else 1)
        return rc
    if cmd == "list-unit-files":
        for path in sorted(args.unit_dir.glob("*.service")):
            print(f"{path.name} {'enabled' if units.enabled(path.name) else 'disabled'}")
        return 0
    if cmd in ("enable", "disable"):
        for unit in names:
            marker = args.state_dir / f"{units.name(unit)}.enabled"
            if cmd == "enable":
                marker.touch()
            else:
                marker.unlink(missing_ok=True)
        return 0
    if cmd == "start":
        return max((units.start(u) for u in names), default=0)
    if cmd == "stop":
        return max((units.stop(u) for u in names), default=0)
    if cmd in ("restart", "reload-or-restart", "try-restart"):
        rc = 0
        for unit in names:
            if cmd == "try-restart" and units.active_state(unit) != "active":
                continue
            units.stop(unit)
            rc = max(rc, units.start(unit))
        return rc
    print(f"simulated systemctl: unsupported command {cmd!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
