"""Helpers for the deployment tests: a real sshd on 127.0.0.1, make targets, PLAY RECAP parsing."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from support.nspawn_targets import ensure_host_packages

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)",
    re.M,
)


def runtime_venv() -> Path:
    """The cached runtime venv the Makefile builds (same hash of requirements/runtime.in)."""
    if os.environ.get("GLM5_RUNTIME_VENV"):
        return Path(os.environ["GLM5_RUNTIME_VENV"])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "glm5-sm120"
    digest = hashlib.sha256((REPO / "requirements/runtime.in").read_bytes()).hexdigest()[:12]
    return cache / f"runtime-{digest}"


@dataclass
class Result:
    rc: int
    output: str
    seconds: float

    def recap(self, host: str) -> dict[str, int]:
        for m in RECAP.finditer(self.output):
            if m.group("host") == host:
                return {k: int(v) for k, v in m.groupdict().items() if k != "host"}
        raise AssertionError(f"no PLAY RECAP line for {host}:\n{self.output[-3000:]}")


def make(target: str, *flags: str, timeout: int = 900, **variables: str) -> Result:
    """Run `make [FLAGS] TARGET VAR=...` in the repo as a user would; stdout+stderr together."""
    argv = ["make", "--no-print-directory", *flags, target]
    argv += [f"{k}={v}" for k, v in variables.items()]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", PY_COLORS="0")
    start = time.monotonic()
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return Result(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Sshd:
    port: int
    key: Path
    known_hosts: Path
    proc: subprocess.Popen

    def ansible_vars(self) -> dict[str, object]:
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts}"
            " -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
            # The Debian system Python (apt bindings), not a pyenv shim that PATH may find.
            "ansible_python_interpreter": "/usr/bin/python3",
        }


def start_sshd(root: Path) -> Sshd:
    """A real OpenSSH server on 127.0.0.1:<free port>, own host key and authorized key in ROOT."""
    ensure_host_packages({"sshd": "openssh-server", "ssh-keygen": "openssh-client"})
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation directory sshd insists on
    host_key, user_key = root / "host_ed25519", root / "id_ed25519"
    for key in (host_key, user_key):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
            check=True,
            capture_output=True,
        )
    (root / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
    port = free_port()
    host_pub = host_key.with_suffix(".pub").read_text().split()
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    config = root / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
        "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nSubsystem sftp internal-sftp\n"
        "LogLevel VERBOSE\n"
    )
    proc = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "sshd.log", "w"),  # noqa: SIM115  (kept open for the daemon's life)
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Sshd(port, user_key, known, proc)
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"sshd did not start: {(root / 'sshd.log').read_text()}")
