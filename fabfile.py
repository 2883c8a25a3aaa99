"""Day-2 operations on deployed GLM-5 vLLM hosts over SSH (Fabric 3).

Hosts come from the Ansible inventory (no second list): `fab -H gpu01 status` resolves gpu01
with scripts/ansible_targets.py (a group name stands for its members); without -H every host
of the inventory is used. Variables (service name, port, paths) are the roles' defaults under
the inventory's, rendered by Ansible itself. A name that is not in the inventory is reached as
a bare hostname/IP, like `make deploy HOST=`. Run it as `.venv/bin/fab` or through make.

    fab status                   # every host: GPU, driver, service, patches, /health (exit 1:
                                 # a host is unhealthy or not deployed)
    fab -H gpu01 logs --lines 200
    fab -H gpu01 logs --follow
    fab -H gpu01 restart         # systemctl restart, then wait for /health
    fab -H gpu01 verify          # playbooks/verify.yml (changes nothing)
    fab -H gpu01 smoke           # playbooks/smoke.yml

The inventory is $GLM5_INVENTORY, else inventory/hosts.yml; never an example inventory.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection, task
from invoke import Context

from scripts.ansible_targets import HostVars, TargetError, all_hosts, resolve

REPO = Path(__file__).resolve().parent
VENV_BIN = REPO / ".venv" / "bin"


def inventory() -> str | None:
    return os.environ.get("GLM5_INVENTORY") or None


def fail(message: str) -> SystemExit:
    return SystemExit(f"error: {message}")


@dataclass
class Target:
    name: str
    vars: HostVars

    @property
    def service(self) -> str:
        return str(self.vars["vllm_service_name"])

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.vars['vllm_service_port']}/health"

    @property
    def venv_python(self) -> str:
        return f"{self.vars['vllm_runtime_venv_path']}/bin/python"

    @property
    def src_dir(self) -> str:
        return f"{self.vars['glm5_install_dir']}/src"

    @property
    def key_file(self) -> str:
        return str(self.vars["vllm_service_key_file"])

    def connection(self) -> Connection | Context:
        v = self.vars
        if v.get("ansible_connection") == "local":
            return Context()
        kwargs = {}
        if v.get("ansible_ssh_private_key_file"):
            kwargs["key_filename"] = str(v["ansible_ssh_private_key_file"])
        cxn = Connection(
            host=str(v.get("ansible_host") or self.name),
            user=v.get("ansible_user"),
            port=int(v.get("ansible_port") or 22),
            connect_kwargs=kwargs,
        )
        known = re.search(r"UserKnownHostsFile=(\S+)", str(v.get("ansible_ssh_common_args") or ""))
        if known:
            cxn.client.load_host_keys(known.group(1))
        return cxn


def targets(c: Connection | Context) -> list[Target]:
    """The hosts a task acts on: -H NAME (a group: its members) or every inventory host."""
    try:
        if isinstance(c, Connection):
            names = resolve(c.original_host, inventory()).members
        else:
            names = all_hosts(inventory())
        return [Target(name, HostVars(name, inventory())) for name in names]
    except TargetError as exc:
        raise fail(str(exc)) from None


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


def _deployed(t: Target, cxn: Connection | Context) -> list[str]:
    """What make deploy leaves on a host that is missing here (empty: it was deployed)."""
    missing = []
    for path, test in ((t.venv_python, "-x"), (t.key_file, "-f")):
        if _run(t, cxn, f"test {test} {shlex.quote(path)}").return_code != 0:
            missing.append(path)
    return missing


def _patches(t: Target, cxn: Connection | Context) -> tuple[bool, str]:
    site = t.vars.get("vllm_patches_site_packages") or ""
    cmd = f"{shlex.quote(t.venv_python)} {shlex.quote(t.src_dir)}/scripts/vllm_patches.py verify"
    if site:
        cmd += f" --site-packages {shlex.quote(str(site))}"
    # No pipe: the exit status is the tool's own; the tail is cut here.
    result = _run(t, cxn, f"{cmd} 2>&1")
    lines = result.stdout.strip().splitlines()
    return result.return_code == 0, " / ".join(lines[-3:])


def _status_of(t: Target) -> list[str]:
    """Print one host's state; return what is unhealthy (empty: healthy)."""
    cxn = t.connection()
    print(f"== {t.name}")
    missing = _deployed(t, cxn)
    if missing:
        print(f"not deployed: run make deploy HOST={t.name} first (missing {', '.join(missing)})")
        return ["not deployed"]
    gpu = _run(
        t,
        cxn,
        "nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.used"
        " --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'",
    ).stdout.strip()
    driver = _run(
        t, cxn, "head -1 /proc/driver/nvidia/version 2>/dev/null || echo 'not loaded'"
    ).stdout.strip()
    service = _run(t, cxn, f"systemctl is-active {shlex.quote(t.service)} 2>&1")
    active = (service.stdout.strip().splitlines() or ["?"])[-1]
    patched, patch_tail = _patches(t, cxn)
    health = _health(t, cxn)
    print(f"gpu:     {gpu}")
    print(f"driver:  {driver}")
    print(f"service: {t.service} {active}")
    print(f"patches: {'patched' if patched else 'NOT verified'}: {patch_tail}")
    print(f"health:  {t.health_url} {health}")
    bad = [] if service.return_code == 0 else [f"service {active}"]
    bad += [] if patched else ["patches not verified"]
    bad += [] if health == "200" else [f"health {health}"]
    return bad


@task
def status(c):
    """Show GPU, driver, service, patches and /health of each host; exit 1 if one is unhealthy."""
    unhealthy = {}
    for t in targets(c):
        bad = _status_of(t)
        print(f"{t.name}: {'UNHEALTHY: ' + ', '.join(bad) if bad else 'healthy'}")
        if bad:
            unhealthy[t.name] = bad
    if unhealthy:
        raise fail(f"unhealthy: {', '.join(unhealthy)}")


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
    """Run a playbook on the -H target (a group as one run) or on every inventory host."""
    names = [c.original_host] if isinstance(c, Connection) else None
    try:
        names = names or all_hosts(inventory())
        options = [resolve(name, inventory()).options for name in names]
    except TargetError as exc:
        raise fail(str(exc)) from None
    extra = shlex.split(os.environ.get("GLM5_ANSIBLE_ARGS", ""))
    for name, opts in zip(names, options, strict=True):
        cmd = [str(VENV_BIN / "ansible-playbook"), *opts, f"playbooks/{playbook}", *extra]
        print(f"== {name}: {playbook}")
        rc = subprocess.run(cmd, cwd=REPO, check=False).returncode
        if rc != 0:
            raise fail(f"{name}: {playbook} failed (exit {rc})")


@task
def verify(c):
    """Re-verify pins, patches and the service (playbooks/verify.yml; changes nothing)."""
    _playbook(c, "verify.yml")


@task
def smoke(c):
    """Smoke-test each host's endpoint from the host (playbooks/smoke.yml)."""
    _playbook(c, "smoke.yml")
