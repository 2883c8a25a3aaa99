"""Real-systemd test hosts: systemd-nspawn containers booted from a cached Debian/Ubuntu tree.

Adapted from /work/shared/recipes/nspawn-targets (issue 15). What is real: systemd as PID 1 of
each container (units, handlers, `systemctl status`, journald, `systemd-analyze security`), an
sshd that Ansible reaches over SSH, apt/dpkg, a reboot (the container restarts). What is not: the
kernel (shared with the host), any GPU.

- The base tree is debootstrapped once per recipe into the cache (like the runtime env), under a
  lock, in a temporary directory renamed into place; its name carries a hash of the recipe, so a
  changed recipe builds a new tree and never mutates the old one.
- Each node is an overlay over the untouched base (a throw-away upper dir), booted by
  `systemd-nspawn --boot --register=no --keep-unit` (this host's PID 1 is not systemd: no
  machined, no host bus) inside its own network namespace, on a bridge the suite creates
  (10.214.S.0/24). A supervisor loop boots the container again when it asks for a reboot
  (nspawn exits 133), which is what `systemd-nspawn@.service` does on a systemd host.
- `Targets.close()` halts every container (SIGRTMIN+3 to its systemd), removes overlays,
  cgroups, namespaces and links; `leftovers()` lists anything that survived, for tests to assert.

Needs root, iproute2, util-linux and, installed with a bounded apt-get when missing,
systemd-container, debootstrap and openssh-client.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glm5-sm120"
SUBNET_PREFIX = "10.214"
NET_LOCK = Path("/run/glm5-nspawn-net.lock")
APT_TIMEOUT = 600
DEBOOTSTRAP_TIMEOUT = 1200
BOOT_TIMEOUT = 120

# Packages of every target: systemd as init, sshd + python3-apt for Ansible, nftables for the
# Ray firewall, iproute2/procps/curl for probes, initramfs-tools for the driver role's hooks;
# GNU patch for the patch role (its apt task finds it: the targets reach no archive), python3-venv
# and make for a venv on the target and `make setup` there (the README's prerequisites).
INCLUDE = [
    "ca-certificates", "curl", "dbus", "gpg", "initramfs-tools", "iproute2", "make", "nftables",
    "openssh-server", "patch", "procps", "python3", "python3-apt", "python3-debian",
    "python3-venv", "sudo", "systemd", "systemd-sysv",
]  # fmt: skip
# Units that only slow a container's boot or wait for what it never gets.
MASKED = [
    "apt-daily-upgrade.timer", "apt-daily.timer", "console-getty.service", "e2scrub_all.timer",
    "e2scrub_reap.service", "fstrim.timer", "getty@tty1.service", "man-db.timer",
    "systemd-networkd-wait-online.service", "systemd-timesyncd.service",
]  # fmt: skip
DISTROS: dict[str, dict[str, object]] = {
    "debian12": {
        "suite": "bookworm",
        "mirror": "http://deb.debian.org/debian",
        "sources": [
            "deb http://deb.debian.org/debian bookworm main",
            "deb http://deb.debian.org/debian bookworm-updates main",
            "deb http://deb.debian.org/debian-security bookworm-security main",
        ],
        "args": [],
    },
    # The production OS (Python 3.12, systemd 255). Bookworm's debootstrap has no noble script
    # (gutsy is the generic Ubuntu one) and Debian ships no Ubuntu keyring: the first build is
    # unverified, later ones could pass the tree's own keyring (trust on first use). Universe is
    # on, as on Ubuntu's own server images: python3-venv is there.
    "ubuntu2404": {
        "suite": "noble",
        "mirror": "http://archive.ubuntu.com/ubuntu",
        "sources": [
            "deb http://archive.ubuntu.com/ubuntu noble main universe",
            "deb http://archive.ubuntu.com/ubuntu noble-updates main universe",
            "deb http://archive.ubuntu.com/ubuntu noble-security main universe",
        ],
        "args": ["--no-check-gpg", "--components=main,universe"],
        "script": "/usr/share/debootstrap/scripts/gutsy",
    },
}
RECIPE_VERSION = 3


class TargetError(RuntimeError):
    """A test target could not be built, booted or reached (message says which and why)."""


def _run(
    *cmd: str | Path, check: bool = True, timeout: float = 120, **kw: object
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd], text=True, capture_output=True, timeout=timeout, check=False, **kw
    )
    if check and proc.returncode != 0:
        raise TargetError(f"{' '.join(map(str, cmd))}: rc={proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def ensure_host_packages(binaries: dict[str, str]) -> None:
    """apt-get install (bounded) the Debian packages whose binaries are missing on this host."""
    missing = sorted({pkg for b, pkg in binaries.items() if shutil.which(b) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise TargetError(f"need root and apt-get to install {missing}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if _run(*cmd, check=False, env=env, timeout=APT_TIMEOUT).returncode != 0:
        _run("apt-get", "update", "-q", env=env, timeout=APT_TIMEOUT)
        _run(*cmd, env=env, timeout=APT_TIMEOUT)


def host_requirements() -> str | None:
    """Why this machine cannot run nspawn targets, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, network namespaces, overlayfs)"
    for tool in ("ip", "nsenter", "mount", "apt-get"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


# --- The cached base tree -------------------------------------------------------------------
def recipe(distro: str) -> dict[str, object]:
    if distro not in DISTROS:
        raise TargetError(f"unknown distro {distro!r}; known: {', '.join(DISTROS)}")
    return {
        "version": RECIPE_VERSION,
        "distro": distro,
        **DISTROS[distro],
        "include": INCLUDE,
        "masked": MASKED,
    }


def base_name(distro: str) -> str:
    digest = hashlib.sha256(json.dumps(recipe(distro), sort_keys=True).encode()).hexdigest()
    return f"nspawn-{distro}-{digest[:12]}"


def base_tree(distro: str = "debian12") -> Path:
    """The pristine root tree for DISTRO, debootstrapped once (lock, temp dir, rename)."""
    ensure_host_packages({"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container"})
    CACHE.mkdir(parents=True, exist_ok=True)
    final = CACHE / base_name(distro)
    if (final / "root").is_dir():
        return final / "root"
    with open(CACHE / f"nspawn-{distro}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "root").is_dir():  # another process built it while we waited
            return final / "root"
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=CACHE))
        try:
            start = time.monotonic()
            _debootstrap(distro, tmp)
            _prepare(distro, tmp / "root")
            info = {**recipe(distro), "build_seconds": round(time.monotonic() - start, 1)}
            (tmp / "recipe.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final / "root"


def _debootstrap(distro: str, tmp: Path) -> None:
    r = DISTROS[distro]
    cmd = ["nice", "debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}"]
    cmd += [*r["args"], r["suite"], str(tmp / "root"), r["mirror"]]  # type: ignore[list-item]
    if "script" in r:
        cmd.append(str(r["script"]))
    with open(tmp / "debootstrap.log", "w") as log:
        proc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, timeout=DEBOOTSTRAP_TIMEOUT, check=False
        )
    if proc.returncode != 0:
        tail = (tmp / "debootstrap.log").read_text(errors="replace")[-2000:]
        raise TargetError(f"debootstrap {distro} failed (rc={proc.returncode}):\n{tail}")


def _prepare(distro: str, root: Path) -> None:
    (root / "etc/apt/sources.list").write_text("\n".join(DISTROS[distro]["sources"]) + "\n")  # type: ignore[arg-type]
    for unit in MASKED:
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    (root / "etc/machine-id").write_text("")  # each node gets its own
    # Each node gets its own host key; none may be shared through the base.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    (root / "var/cache/apt/archives").mkdir(parents=True, exist_ok=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


# --- Nodes ------------------------------------------------------------------------------------
@dataclass
class Node:
    """One booted container: its own systemd, sshd on IP:22 in its own network namespace."""

    name: str
    distro: str
    ip: str
    netns: str
    veth: str
    dir: Path
    key: Path
    known_hosts: Path
    binds: tuple[str, ...] = ()
    supervisor: subprocess.Popen | None = None

    @property
    def root(self) -> Path:
        """The container's / as the host sees it (the overlay's merged view)."""
        return self.dir / "merged"

    @property
    def cgroup(self) -> str:
        return f"glm5-nspawn-{self.name}-{self.ip.rsplit('.', 2)[1]}"

    def ansible_vars(self) -> dict[str, object]:
        return {
            "ansible_host": self.ip,
            "ansible_port": 22,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts}"
            " -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
            "ansible_python_interpreter": "/usr/bin/python3",
        }

    def leader(self) -> int | None:
        """Host PID of the container's PID 1 (supervisor -> systemd-nspawn -> systemd)."""
        if self.supervisor is None or self.supervisor.poll() is not None:
            return None
        for nspawn in _children(self.supervisor.pid, "systemd-nspawn"):
            for init in _children(nspawn, "systemd"):
                return init
        return None

    def run(
        self, *cmd: str | Path, check: bool = False, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run CMD inside the container (what `machinectl shell` does with machined)."""
        leader = self.leader()
        if leader is None:
            raise TargetError(f"{self.name}: not running")
        ns = ["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", "--"]
        return _run(*ns, *cmd, check=check, timeout=timeout, input=input)

    def spawn(self, *cmd: str | Path, log: Path) -> subprocess.Popen:
        """Start CMD inside the container without waiting; its stdout and stderr go to LOG."""
        leader = self.leader()
        if leader is None:
            raise TargetError(f"{self.name}: not running")
        ns = ["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", "--"]
        with open(log, "ab") as out:
            return subprocess.Popen(
                [*ns, *map(str, cmd)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait_booted(self, timeout: float = BOOT_TIMEOUT) -> str:
        """Wait until the container's systemd says running (or degraded); return that state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.supervisor is None or self.supervisor.poll() is not None:
                raise TargetError(f"{self.name}: nspawn exited; see {self.dir / 'console.log'}")
            if self.leader() is not None:
                with contextlib.suppress(TargetError, subprocess.TimeoutExpired):
                    state = self.run("systemctl", "is-system-running", timeout=10).stdout.strip()
                if state in ("running", "degraded"):
                    return state
            time.sleep(0.3)
        raise TargetError(f"{self.name}: not booted after {timeout:.0f} s (state {state!r})")

    def wait_ssh(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = _run(*self.ssh_argv("true"), check=False, timeout=20)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TargetError(f"{self.name}: ssh {self.ip} fails: {proc.stderr.strip()}")
            time.sleep(0.5)

    def ssh_argv(self, *cmd: str) -> list[str]:
        return [
            "ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5", f"root@{self.ip}", *cmd,
        ]  # fmt: skip

    def boot(self) -> None:
        """Start the supervisor loop: nspawn, and nspawn again whenever the container reboots."""
        nspawn = [
            "systemd-nspawn", "--boot", f"--directory={self.root}", f"--machine={self.name}",
            "--register=no", "--keep-unit", "--console=passive", "--resolv-conf=off",
            f"--network-namespace-path=/run/netns/{self.netns}",
            # the node's own nftables (the Ray firewall) and `ip` inside its namespace
            "--capability=CAP_NET_ADMIN",
            *(f"--bind-ro={path}" for path in self.binds),
        ]  # fmt: skip
        script = (
            # Own cgroup per container: with --keep-unit nspawn nests its payload under the
            # current cgroup, the host's root here, and two containers would share
            # /payload/system.slice/<unit> and stop each other's services.
            'for h in systemd unified; do mkdir -p "/sys/fs/cgroup/$h/$0" && '
            'echo $$ >"/sys/fs/cgroup/$h/$0/cgroup.procs"; done\n'
            'while :; do "$@" </dev/null; rc=$?; echo "[supervisor] nspawn rc=$rc" >&2\n'
            '  rm -rf "/run/systemd/nspawn/propagate/$1"\n'  # nspawn leaves it (no tmpfs /run)
            '  [ "$rc" = 133 ] || exit "$rc"; done'  # 133: the container asked for a reboot
        )
        log = open(self.dir / "console.log", "ab")  # noqa: SIM115  (the daemon's own log)
        self.supervisor = subprocess.Popen(
            ["bash", "-c", script, self.cgroup, *nspawn],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()

    def halt(self, timeout: float = 30) -> None:
        """Clean shutdown (SIGRTMIN+3 = systemctl halt), SIGKILL to the group after TIMEOUT."""
        sup = self.supervisor
        if sup is None:
            return
        leader = self.leader()
        if leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader, signal.SIGRTMIN + 3)
        try:
            sup.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sup.pid, signal.SIGKILL)
            sup.wait(timeout=10)
        # Anything left in its cgroups (a stray payload) goes too, then the cgroups themselves.
        for hierarchy in ("systemd", "unified"):
            top = Path("/sys/fs/cgroup") / hierarchy / self.cgroup
            for _ in range(50):
                pids = _cgroup_pids(top)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            if top.is_dir():
                for d in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{self.name}", ignore_errors=True)
        self.supervisor = None


def _children(pid: int, comm: str) -> list[int]:
    out = _run("pgrep", "-P", str(pid), "-x", comm, check=False, timeout=10).stdout
    return [int(p) for p in out.split()]


def _cgroup_pids(top: Path) -> list[int]:
    pids: list[int] = []
    if top.is_dir():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids += [int(p) for p in procs.read_text().split()]
    return pids


@dataclass
class Targets:
    """A bridge 10.214.S.1/24 owned by this suite and the nodes booted on it (10.214.S.10+)."""

    work: Path
    subnet: int
    bridge: str
    key: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    _servers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The host's address on the bridge: what the containers reach the host at."""
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    def add(self, name: str, distro: str = "debian12", binds: tuple[str, ...] = ()) -> Node:
        """Boot a fresh node NAME (hostname NAME) on an overlay of the DISTRO base tree.

        BINDS: host paths bind-mounted read-only at the same path (a cached venv, say).
        """
        base = base_tree(distro)
        index = len(self.nodes)
        ip = f"{SUBNET_PREFIX}.{self.subnet}.{10 + index}"
        node = Node(
            name=name,
            distro=distro,
            ip=ip,
            netns=f"g5n{self.subnet}-{index}",
            veth=f"g5v{self.subnet}-{index}",
            dir=self.work / name,
            key=self.key,
            known_hosts=self.work / name / "known_hosts",
            binds=binds,
        )
        self.nodes[name] = node
        for sub in ("upper", "work", "merged"):
            (node.dir / sub).mkdir(parents=True)
        _run("ip", "netns", "add", node.netns)
        _run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0",
             "netns", node.netns)  # fmt: skip
        _run("ip", "link", "set", node.veth, "master", self.bridge, "up")
        _run("ip", "-n", node.netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "-n", node.netns, "link", "set", "eth0", "up")
        _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        _run("ip", "-n", node.netns, "route", "add", "default", "via", self.gateway)
        layers = f"lowerdir={base},upperdir={node.dir}/upper,workdir={node.dir}/work"
        _run("mount", "-t", "overlay", "overlay", "-o", layers, node.root)
        self._personalise(node)
        node.boot()
        node.wait_booted()
        node.wait_ssh()
        return node

    def _personalise(self, node: Node) -> None:
        r = node.root
        (r / "etc/hostname").write_text(f"{node.name}\n")
        # debootstrap's minbase writes no /etc/hosts, and there is no DNS: localhost must resolve.
        (r / "etc/hosts").write_text(
            f"127.0.0.1 localhost\n127.0.1.1 {node.name}\n"
            "::1 localhost ip6-localhost ip6-loopback\n"
        )
        (r / "etc/machine-id").write_text(os.urandom(16).hex() + "\n")
        # No DNS: the suite's network has no resolver, and a lookup must fail at once rather
        # than time out against the host's (unreachable) one.
        (r / "etc/resolv.conf").unlink(missing_ok=True)
        (r / "etc/resolv.conf").write_text("# glm5 test node: no resolver\n")
        host_key = r / "etc/ssh/ssh_host_ed25519_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", host_key)
        pub = host_key.with_suffix(".pub").read_text().split()
        node.known_hosts.write_text(f"{node.ip} {pub[0]} {pub[1]}\n")
        (r / "etc/ssh/sshd_config.d/glm5-test.conf").write_text(
            f"ListenAddress {node.ip}\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUseDNS no\n"
        )
        auth = r / "root/.ssh/authorized_keys"
        auth.write_text(self.key.with_suffix(".pub").read_text())
        auth.chmod(0o600)

    def remove(self, name: str) -> None:
        node = self.nodes.pop(name)
        node.halt()
        for pid in _run("ip", "netns", "pids", node.netns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        if os.path.ismount(node.root):
            _run("umount", node.root, check=False)
        _run("ip", "link", "del", node.veth, check=False)
        _run("ip", "netns", "del", node.netns, check=False)
        shutil.rmtree(node.dir, ignore_errors=True)

    def serve(self, directory: Path, port: int) -> None:
        """Serve DIRECTORY over HTTP on the bridge address (what the nodes reach the host at)."""
        log = open(self.work / f"http-{port}.log", "ab")  # noqa: SIM115  (the server's own log)
        proc = subprocess.Popen(
            ["python3", "-m", "http.server", str(port), "--bind", self.gateway,
             "--directory", str(directory)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        self._servers.append(proc)
        deadline = time.monotonic() + 20
        import socket

        while True:
            try:
                socket.create_connection((self.gateway, port), timeout=1).close()
                return
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise TargetError(f"http.server on {self.gateway}:{port}: {exc}") from exc
                time.sleep(0.1)

    def close(self) -> None:
        errors = []
        for name in list(self.nodes):
            try:
                self.remove(name)
            except Exception as exc:  # keep tearing the rest down
                errors.append(f"{name}: {exc}")
        for proc in self._servers:
            proc.terminate()
            proc.wait(timeout=10)
        # SSH masters of this suite's Ansible runs (ControlPersist keeps them 60 s after a host
        # is gone): found by this suite's own work path in their command line, ended by PID.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._own_processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            for _ in range(50):
                if not self._own_processes():
                    break
                time.sleep(0.1)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.work, ignore_errors=True)
        if errors:
            raise TargetError("teardown: " + "; ".join(errors))

    def _own_processes(self) -> list[int]:
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if str(self.work).encode() in (proc / "cmdline").read_bytes():
                        pids.append(int(proc.name))
        return pids

    def leftovers(self) -> list[str]:
        """What of this suite still exists on the host (should be [] after close())."""
        left = []
        if Path(f"/sys/class/net/{self.bridge}").exists():
            left.append(f"link {self.bridge}")
        netns = _run("ip", "netns", "list", check=False).stdout
        left += [f"netns {ns}" for ns in netns.split() if ns.startswith(f"g5n{self.subnet}-")]
        mounts = Path("/proc/self/mounts").read_text()
        left += [f"mount {m.split()[1]}" for m in mounts.splitlines() if str(self.work) in m]
        for hierarchy in ("systemd", "unified"):
            for d in Path("/sys/fs/cgroup", hierarchy).glob("glm5-nspawn-*"):
                if d.name.endswith(f"-{self.subnet}"):
                    left.append(f"cgroup {d}")
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    if str(self.work) in cmd:
                        left.append(f"process {proc.name}: {cmd[:120]}")
        return left


def _claim_subnet() -> int:
    """A 10.214.S.0/24 no other suite on this host uses (held by creating its bridge)."""
    with open(NET_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        used = _run("ip", "-o", "-4", "addr", "show").stdout
        for s in range(1, 255):
            if f" {SUBNET_PREFIX}.{s}." not in used:
                bridge = f"g5b{s}"
                _run("ip", "link", "add", bridge, "type", "bridge")
                _run("ip", "addr", "add", f"{SUBNET_PREFIX}.{s}.1/24", "dev", bridge)
                _run("ip", "link", "set", bridge, "up")
                return s
    raise TargetError(f"no free {SUBNET_PREFIX}.S.0/24 subnet")


@contextlib.contextmanager
def targets() -> Iterator[Targets]:
    """A set of nspawn nodes on a fresh bridge; everything is torn down on exit."""
    ensure_host_packages(
        {"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap",
         "ssh": "openssh-client", "ssh-keygen": "openssh-client"}
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="glm5-nspawn-", dir="/var/tmp"))
    key = work / "id_ed25519"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "glm5-tests", "-f", key)
    subnet = _claim_subnet()
    t = Targets(work=work, subnet=subnet, bridge=f"g5b{subnet}", key=key)
    try:
        yield t
    finally:
        t.close()
