"""Day-2 operations on deployed GLM-5 vLLM hosts over SSH (Fabric 3).

Hosts come from the Ansible inventory (no second list): `fab -H gpu01 status` resolves gpu01
with `ansible-inventory` (group_vars included); without -H every inventory host is used. A name
that is not in the inventory is reached as a bare hostname/IP, like `make deploy HOST=`.

    fab status                   # every inventory host: GPU, driver, service, patches, /health
    fab -H gpu01 logs --lines 200
    fab -H gpu01 logs --follow
    fab -H gpu01 restart         # systemctl restart, then wait for /health
    fab -H gpu01 verify          # playbooks/verify.yml (changes nothing)
    fab -H gpu01 smoke           # playbooks/smoke.yml

The inventory is $GLM5_INVENTORY, else inventory/hosts.yml, else inventory/hosts.example.yml.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection, task
from invoke import Context

REPO = Path(__file__).resolve().parent
VENV_BIN = REPO / ".venv" / "bin"
_VAR = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def inventory_path() -> Path:
    if os.environ.get("GLM5_INVENTORY"):
        return Path(os.environ["GLM5_INVENTORY"])
    real = REPO / "inventory" / "hosts.yml"
    return real if real.exists() else REPO / "inventory" / "hosts.example.yml"


def _ansible_inventory(*args: str) -> dict:
    out = subprocess.run(
        [str(VENV_BIN / "ansible-inventory"), "-i", str(inventory_path()), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(out.stdout)


def _resolve(hostvars: dict) -> dict:
    """Expand plain `{{ name }}` references between inventory variables (a few rounds)."""
    resolved = dict(hostvars)
    for _ in range(5):
        for key, value in resolved.items():
            if isinstance(value, str):
                resolved[key] = _VAR.sub(lambda m: str(resolved.get(m.group(1), m.group(0))), value)
    return resolved


@dataclass
class Target:
    name: str
    vars: dict

    def get(self, key: str, default: str) -> str:
        value = self.vars.get(key, default)
        return default if isinstance(value, str) and "{{" in value else str(value)

    @property
    def service(self) -> str:
        return self.get("vllm_service_name", "glm5-vllm")

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.get('vllm_service_port', '8000')}/health"

    @property
    def venv_python(self) -> str:
        return self.get("vllm_runtime_venv_path", "/opt/glm5/venv") + "/bin/python"

    @property
    def src_dir(self) -> str:
        return self.get("glm5_install_dir", "/opt/glm5") + "/src"

    def connection(self) -> Connection | Context:
        if self.vars.get("ansible_connection") == "local":
            return Context()
        kwargs = {}
        key = self.vars.get("ansible_ssh_private_key_file")
        if key:
            kwargs["key_filename"] = str(key)
        cxn = Connection(
            host=str(self.vars.get("ansible_host", self.name)),
            user=self.vars.get("ansible_user"),
            port=int(self.vars.get("ansible_port", 22)),
            connect_kwargs=kwargs,
        )
        known = re.search(r"UserKnownHostsFile=(\S+)", self.vars.get("ansible_ssh_common_args", ""))
        if known:
            cxn.client.load_host_keys(known.group(1))
        return cxn


def targets(c: Connection | Context) -> list[Target]:
    """The hosts a task acts on: -H names (resolved in the inventory) or every inventory host."""
    if isinstance(c, Connection):
        name = c.original_host
        data = _ansible_inventory("-i", f"{name},", "--host", name)
        return [Target(name, _resolve(data))]
    data = _ansible_inventory("--list")
    hostvars = data.get("_meta", {}).get("hostvars", {})
    return [Target(name, _resolve(hostvars[name])) for name in sorted(hostvars)]


def _run(t: Target, cxn: Connection | Context, command: str, **kwargs):
    """Run as root: directly when the SSH user is root or local root, else through sudo."""
    kwargs.setdefault("warn", True)
    kwargs.setdefault("hide", True)
    kwargs.setdefault("in_stream", False)
    user = t.vars.get("ansible_user") if isinstance(cxn, Connection) else None
    if (user or os.environ.get("USER", "root")) != "root" and t.vars.get("ansible_become"):
        return cxn.sudo(command, **kwargs)
    return cxn.run(command, **kwargs)


def _health(t: Target, cxn: Connection | Context) -> str:
    probe = (
        "import sys, urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen({t.health_url!r}, timeout=5).status)\n"
        "except Exception as exc:\n"
        "    print(f'down ({exc.__class__.__name__})')\n"
    )
    return _run(t, cxn, f"python3 -c {shlex.quote(probe)}").stdout.strip()


@task
def status(c):
    """Show GPU, driver, service, patch state and /health of each host."""
    for t in targets(c):
        cxn = t.connection()
        gpu = _run(
            t,
            cxn,
            "nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.used"
            " --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'",
        ).stdout.strip()
        driver = _run(
            t, cxn, "head -1 /proc/driver/nvidia/version 2>/dev/null || echo 'not loaded'"
        ).stdout.strip()
        service = _run(t, cxn, f"systemctl is-active {shlex.quote(t.service)} 2>&1").stdout
        patches = _run(
            t,
            cxn,
            f"{shlex.quote(t.venv_python)} {shlex.quote(t.src_dir)}/scripts/vllm_patches.py"
            " verify 2>&1 | tail -3",
        )
        print(f"== {t.name}")
        print(f"gpu:     {gpu}")
        print(f"driver:  {driver}")
        active = service.strip().splitlines()[-1] if service.strip() else "?"
        print(f"service: {t.service} {active}")
        state = "patched" if patches.return_code == 0 else "NOT verified"
        print(f"patches: {state}: {patches.stdout.strip()}")
        print(f"health:  {t.health_url} {_health(t, cxn)}")


@task(help={"lines": "journal lines to show", "follow": "keep following the journal"})
def logs(c, lines=100, follow=False):
    """Show the vLLM service journal (tail, or follow)."""
    for t in targets(c):
        cxn = t.connection()
        cmd = f"journalctl --no-pager -u {shlex.quote(t.service)} -n {int(lines)}"
        if follow:
            cmd += " -f"
        print(f"== {t.name}")
        result = _run(t, cxn, cmd, hide=False, pty=bool(follow))
        if result.return_code != 0:
            print(f"error: {t.name}: journalctl exited {result.return_code}")


@task(help={"timeout": "seconds to wait for /health after the restart"})
def restart(c, timeout=1200):
    """Restart the vLLM service and wait until /health answers 200."""
    for t in targets(c):
        cxn = t.connection()
        result = _run(t, cxn, f"systemctl restart {shlex.quote(t.service)}")
        if result.return_code != 0:
            raise SystemExit(f"error: {t.name}: systemctl restart failed: {result.stderr.strip()}")
        deadline = time.monotonic() + int(timeout)
        while (state := _health(t, cxn)) != "200":
            if time.monotonic() > deadline:
                tail = _run(t, cxn, f"journalctl --no-pager -u {shlex.quote(t.service)} -n 50")
                raise SystemExit(
                    f"error: {t.name}: no /health 200 after {timeout} s ({state})\n{tail.stdout}"
                )
            time.sleep(10)
        print(f"{t.name}: {t.service} restarted, /health 200")


def _playbook(c, playbook: str) -> None:
    for t in targets(c):
        cmd = [
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            str(inventory_path()),
            "-i",
            f"{t.name},",
            "-l",
            t.name,
            f"playbooks/{playbook}",
        ]
        extra = os.environ.get("GLM5_ANSIBLE_ARGS", "")
        cmd += shlex.split(extra)
        print(f"== {t.name}: {playbook}")
        rc = subprocess.run(cmd, cwd=REPO, check=False).returncode
        if rc != 0:
            raise SystemExit(f"error: {t.name}: {playbook} failed (exit {rc})")


@task
def verify(c):
    """Re-verify pins, patches and the service (playbooks/verify.yml; changes nothing)."""
    _playbook(c, "verify.yml")


@task
def smoke(c):
    """Smoke-test each host's endpoint from the host (playbooks/smoke.yml)."""
    _playbook(c, "smoke.yml")
