"""A real Ray cluster of three simulated hosts, formed by playbooks/cluster.yml (issue 9).

Each "host" is a network namespace on a private bridge (10.213.N.0/24) with its own mount
namespace: an overlay over /etc (so users, units and /etc/glm5 are per host), a tmpfs on
/var/lib/glm5-ray (Ray's sessions) and tests/integration/simulated_systemctl.py bind-mounted over
/usr/bin/systemctl, because PID 1 of the CI VM is not systemd. An sshd listens on each host's
address, and Ansible reaches the hosts over SSH from an inventory, the way `make deploy` does.
Ray 2.48.0 (the role's pin) comes from PyPI into a cached venv outside the repo.

Traffic stays on 127.0.0.0/8 and the bridge. Needs root and iproute2; openssh-server is
installed with apt-get when missing. What cannot run here (GPUs, NCCL across hosts, vLLM on
Ray) is switched off by the group variables written in `_inventory` and named there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks/roles/ray_cluster"
SHIM = Path(__file__).resolve().parent / "simulated_systemctl.py"
BIN = Path(sys.executable).parent
HOSTS = ["glm5-head", "glm5-w1", "glm5-w2"]
UNIT = "glm5-ray.service"
RECAP = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)

pytestmark = pytest.mark.slow


def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


RAY_VERSION = _defaults()["ray_cluster_ray_version"]
RAY_STATE_DIR = _defaults()["ray_cluster_state_dir"]


# --- Static checks (milliseconds) ---------------------------------------------------------
def test_role_defaults_match_argument_specs() -> None:
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    defaults = _defaults()
    assert sorted(options) == sorted(defaults)
    for name, value in defaults.items():
        assert options[name]["default"] == value, name
        assert options[name]["description"].strip(), name


def test_ray_pin_is_one_fact() -> None:
    all_yml = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    assert all_yml["glm5_ray_version"] == RAY_VERSION
    assert all_yml["ray_cluster_ray_version"] == "{{ glm5_ray_version }}"
    # vLLM 0.23.0's compiled-graph executor (pipeline parallel over Ray) refuses Ray < 2.43.0.
    assert tuple(int(x) for x in RAY_VERSION.split(".")) >= (2, 43, 0)


def test_port_probe_reports_refused_port_by_name() -> None:
    probe = ROLE / "files/ray_port_probe.py"
    out = subprocess.run(
        [sys.executable, probe, "connect", "--target", "peer=127.0.0.1:9", "--timeout", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == {"failed": ["peer at 127.0.0.1:9 (Connection refused)"]}


# --- The simulated hosts ------------------------------------------------------------------
def _run(*cmd: str | Path, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], text=True, capture_output=True, check=check, **kw)


def _ray_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glm5-sm120"
    venv = cache / f"ray-{RAY_VERSION}"
    if not (venv / ".installed").exists():
        shutil.rmtree(venv, ignore_errors=True)
        python = shutil.which("python3.11") or sys.executable
        _run(python, "-m", "venv", venv)
        _run(
            venv / "bin/pip", "install", "-q", "--disable-pip-version-check", f"ray=={RAY_VERSION}"
        )
        (venv / ".installed").touch()
    return venv


def _ensure_sshd() -> None:
    if Path("/usr/sbin/sshd").exists():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if _run("apt-get", "install", "-y", "-q", "openssh-server", check=False, env=env).returncode:
        _run("apt-get", "update", "-q", env=env)
        _run("apt-get", "install", "-y", "-q", "openssh-server", env=env)


class Cluster:
    """Three namespaced hosts with sshd, and helpers to drive the playbook against them."""

    def __init__(self, root: Path, ray_venv: Path) -> None:
        self.root = root
        self.ray_venv = ray_venv
        tag = os.getpid() % 100000
        self.subnet = f"10.213.{os.getpid() % 250}"
        self.bridge = f"g5rb{tag}"
        self.ns = {h: f"g5r{tag}h{i}" for i, h in enumerate(HOSTS)}
        self.ip = {h: f"{self.subnet}.{10 + i}" for i, h in enumerate(HOSTS)}
        self.sshd: dict[str, subprocess.Popen] = {}
        self.key = root / "id_ed25519"

    # network and sshd
    def up(self) -> None:
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key)
        shutil.copy(f"{self.key}.pub", self.root / "authorized_keys")
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        Path("/run/sshd").mkdir(exist_ok=True)
        # Mount point for each host's private tmpfs (Ray's state dir, the role's default path).
        Path(RAY_STATE_DIR).mkdir(exist_ok=True)
        for host in HOSTS:
            ns, veth = self.ns[host], f"{self.ns[host]}v"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip[host]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            hdir = self.root / host
            for sub in ("etc-up", "etc-work", "state"):
                (hdir / sub).mkdir(parents=True)
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hdir / "host_key")
            (hdir / "systemctl").write_text(
                f'#!/bin/sh\nexec {sys.executable} {SHIM} --state-dir {hdir / "state"} "$@"\n'
            )
            (hdir / "systemctl").chmod(0o755)
            (hdir / "sshd_config").write_text(
                textwrap.dedent(f"""\
                ListenAddress {self.ip[host]}:22
                HostKey {hdir / "host_key"}
                PidFile {hdir / "sshd.pid"}
                AuthorizedKeysFile {self.root / "authorized_keys"}
                PermitRootLogin prohibit-password
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                UsePAM no
                StrictModes no
                Subsystem sftp internal-sftp
                """)
            )
            self.start_sshd(host)
        for host in HOSTS:
            self.wait_port(host, 22)

    def start_sshd(self, host: str) -> None:
        hdir = self.root / host
        script = (
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={hdir}/etc-up,"
            f"workdir={hdir}/etc-work /etc && mount -t tmpfs tmpfs {RAY_STATE_DIR} && "
            f"mount --bind {hdir}/systemctl /usr/bin/systemctl && "
            f"exec /usr/sbin/sshd -D -e -f {hdir}/sshd_config"
        )
        log = open(hdir / "sshd.log", "ab")  # noqa: SIM115
        self.sshd[host] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[host], "unshare", "--mount", "--propagation",
             "private", "--", "/bin/sh", "-c", script],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def stop_sshd(self, host: str) -> None:
        proc = self.sshd.pop(host)
        proc.terminate()
        proc.wait(timeout=10)

    def wait_port(self, host: str, port: int, timeout: float = 15) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((self.ip[host], port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def in_host(self, host: str, *cmd: str | Path, check: bool = False, timeout: float = 120):
        """Run a command in the host's network and mount namespaces (those of its sshd)."""
        pid = str(self.sshd[host].pid)
        return _run("nsenter", "-t", pid, "-n", "-m", *cmd, check=check, timeout=timeout)

    def ray_processes(self) -> list[str]:
        """Command lines of processes started from the Ray venv (any simulated host)."""
        out = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if str(self.ray_venv) in cmd and "ray" in cmd:
                    out.append(cmd)
        return out

    def down(self) -> None:
        for host in HOSTS:
            _run(sys.executable, SHIM, "--state-dir", self.root / host / "state", "kill-all",
                 check=False)  # fmt: skip
        for host in list(self.sshd):
            proc = self.sshd.pop(host)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        # SSH masters of the controller and the per-connection sshd they keep in the namespaces.
        for pid in _pids_matching(f"ssh: {self.root}/"):
            os.kill(pid, signal.SIGTERM)
        for ns in self.ns.values():
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                os.kill(int(pid), signal.SIGKILL)
            _run("ip", "link", "del", f"{ns}v", check=False)
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)

    # ansible
    def inventory(self, host_vars: dict[str, dict] | None = None) -> Path:
        inv = self.root / "inventory"
        (inv / "group_vars").mkdir(parents=True, exist_ok=True)
        # The repository's real knobs, then what this machine cannot do, switched off by name.
        shutil.copy(REPO / "inventory/group_vars/all.yml", inv / "group_vars/all.yml")
        group = {
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no"
            " -o UserKnownHostsFile=/dev/null",
            "ray_cluster_venv": str(self.ray_venv),  # Ray only: no vLLM venv on this machine
            "ray_cluster_ray_extras": [],  # cgraph pulls cupy (CUDA): nothing to run it on here
            "ray_cluster_user": "root",  # the cached venv lives under /root
            "ray_cluster_group": "root",
            "ray_cluster_create_user": False,
            "ray_cluster_socket_users": [],
            # nftables in the shared host network namespace: tested on nspawn nodes instead
            # (test_ray_exposure.py), where each node has its own.
            "ray_cluster_firewall": False,
            "ray_cluster_preflight_gpu": False,  # no GPU, no nvidia-smi
            "ray_cluster_preflight_packages": ["ray", "pip"],
            "ray_cluster_preflight_timeout": 6,
            "ray_cluster_num_cpus": 1,
            "ray_cluster_num_gpus": 0,
            "ray_cluster_object_store_memory": 80_000_000,
            "glm5_cluster_tensor_parallel_size": 1,  # no GPUs to count
            "glm5_cluster_serve": False,  # vLLM on Ray needs GPUs on every host
        }
        hosts = {h: {"ansible_host": self.ip[h], "ray_cluster_node_ip": self.ip[h]} for h in HOSTS}
        for host, extra in (host_vars or {}).items():
            hosts[host].update(extra)
        doc = {
            "all": {
                "children": {
                    "glm5_cluster": {
                        "children": {
                            "glm5_head": {"hosts": {HOSTS[0]: hosts[HOSTS[0]]}},
                            "glm5_workers": {"hosts": {h: hosts[h] for h in HOSTS[1:]}},
                        },
                    }
                }
            }
        }
        (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
        # A group_vars file: inline group vars would lose to group_vars/all.yml.
        (inv / "group_vars/glm5_cluster.yml").write_text(yaml.safe_dump(group))
        return inv / "hosts.yml"

    def playbook(self, *args: str, host_vars: dict[str, dict] | None = None):
        env = {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(REPO / "playbooks/roles"),
            # A fresh SSH master per run: a persisted one would outlive a host that went down.
            "ANSIBLE_SSH_CONTROL_PATH_DIR": tempfile.mkdtemp(prefix="cp", dir=self.root),
            "ANSIBLE_LOCAL_TEMP": str(self.root / "atmp"),
            "ANSIBLE_PIPELINING": "true",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
        }
        cmd = [BIN / "ansible-playbook", "-i", self.inventory(host_vars),
               REPO / "playbooks/cluster.yml", *args]  # fmt: skip
        start = time.monotonic()
        proc = _run(*cmd, check=False, env=env, cwd=REPO, timeout=400)
        proc.wall = time.monotonic() - start  # type: ignore[attr-defined]
        print(f"$ ansible-playbook {' '.join(args)}: rc={proc.returncode} in {proc.wall:.1f} s")
        return proc


def _pids_matching(prefix: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if cmd.startswith(prefix):
                pids.append(int(proc.name))
    return pids


def recap(out: str) -> dict[str, dict[str, int]]:
    return {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in RECAP.finditer(out)
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
        pytest.skip("needs root, iproute2 and util-linux (network and mount namespaces)")
    _ensure_sshd()
    venv = _ray_venv()
    root = Path(tempfile.mkdtemp(prefix="g5r", dir="/tmp"))
    c = Cluster(root, venv)
    try:
        c.up()
        yield c
    finally:
        c.down()
        shutil.rmtree(root, ignore_errors=True)


def _ray_status(c: Cluster, nodes: int = len(HOSTS), tries: int = 30) -> str:
    # ray.nodes() (what the role waits on) sees a node before the autoscaler's report in
    # `ray status` does; on a 2-core machine that report lags by seconds. Poll, bounded.
    for _ in range(tries):
        proc = c.in_host(
            HOSTS[0], c.ray_venv / "bin/ray", "status", "--address", f"{c.ip[HOSTS[0]]}:6379"
        )
        out = proc.stdout + proc.stderr
        if "Active:" in out and _active_nodes(out) >= nodes:
            return out
        time.sleep(2)
    return out


def _active_nodes(status: str) -> int:
    if "Active:" not in status:
        return 0
    active = status.split("Active:", 1)[1].split("Pending:", 1)[0]
    return len(re.findall(r"^\s*1 node_[0-9a-f]+$", active, re.M))


TASK_ON_EACH_NODE = """
import json, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="{address}", logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def where(x):
    return ray.util.get_node_ip_address(), x * x

nodes = [n for n in ray.nodes() if n["Alive"]]
refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        .remote(i) for i, n in enumerate(nodes)]
print(json.dumps(sorted(ray.get(refs, timeout=120))))
"""


def _task_on_each_node(c: Cluster) -> list[list]:
    script = c.root / "task.py"
    script.write_text(TASK_ON_EACH_NODE.format(address=f"{c.ip[HOSTS[0]]}:6379"))
    proc = c.in_host(HOSTS[0], c.ray_venv / "bin/python", script, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- The proof ----------------------------------------------------------------------------
def test_check_mode_on_fresh_hosts_writes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook("--check", "--diff")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert set(recap(proc.stdout)) == set(HOSTS)
    for host in HOSTS:
        assert not (cluster.root / host / "etc-up/systemd/system" / UNIT).exists()
    assert cluster.ray_processes() == []


def test_converge_forms_cluster_and_runs_a_task_on_every_node(cluster: Cluster) -> None:
    proc = cluster.playbook()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert all(r["failed"] == 0 and r["changed"] > 0 for r in recap(proc.stdout).values())
    # The layout handed to vLLM: TP = GPUs per host (set: no GPUs here), PP = hosts.
    assert (
        "--distributed-executor-backend ray --tensor-parallel-size 1 --pipeline-parallel-size 3"
        in proc.stdout
    )
    status = _ray_status(cluster)
    assert _active_nodes(status) == 3, status
    assert " 0.0/3.0 CPU" in status, status
    ips = sorted(cluster.ip.values())
    assert [ip for ip, _ in _task_on_each_node(cluster)] == ips
    assert sorted(sq for _, sq in _task_on_each_node(cluster)) == [0, 1, 4]


def test_units_and_environment_are_rendered_per_host(cluster: Cluster) -> None:
    head_ip = cluster.ip[HOSTS[0]]
    for host in HOSTS:
        etc = cluster.root / host / "etc-up"
        unit = (etc / "systemd/system" / UNIT).read_text()
        env = (etc / "glm5/ray.env").read_text()
        assert f"--node-ip-address={cluster.ip[host]}" in unit
        assert ("--head --port=6379" in unit) == (host == HOSTS[0])
        assert (f"--address={head_ip}:6379" in unit) == (host != HOSTS[0])
        assert f"VLLM_HOST_IP={cluster.ip[host]}\n" in env
        assert f"RAY_ADDRESS={head_ip}:6379\n" in env
        assert "NCCL_P2P_DISABLE=1\n" in env
        verify = cluster.in_host(host, "systemd-analyze", "verify", f"/etc/systemd/system/{UNIT}")
        assert verify.returncode == 0, verify.stderr


def test_second_converge_changes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {h: r["changed"] for h, r in recap(proc.stdout).items()} == dict.fromkeys(HOSTS, 0)


def test_check_mode_on_converged_cluster_changes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook("--check", "--diff")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {h: r["changed"] for h, r in recap(proc.stdout).items()} == dict.fromkeys(HOSTS, 0)


def test_fabric_status_spans_the_cluster(cluster: Cluster) -> None:
    env = {**os.environ, "GLM5_INVENTORY": str(cluster.root / "inventory/hosts.yml")}
    fab = [BIN / "fab", "-c", "fabfile_cluster", "status"]
    proc = _run(*fab, check=False, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for host in HOSTS:
        role = "head" if host == HOSTS[0] else "worker"
        assert f"== {host} ({role}, {cluster.ip[host]}): glm5-ray active\n" in proc.stdout
    assert "ray nodes alive: 3/3\n" in proc.stdout


def test_teardown_is_idempotent_and_rerun_forms_the_cluster_again(cluster: Cluster) -> None:
    down = cluster.playbook("-e", "ray_cluster_state=absent")
    assert down.returncode == 0, down.stdout[-4000:]
    assert all(r["changed"] > 0 for r in recap(down.stdout).values())
    assert cluster.ray_processes() == []
    for host in HOSTS:
        assert not (cluster.root / host / "etc-up/systemd/system" / UNIT).exists()
    again = cluster.playbook("-e", "ray_cluster_state=absent")
    assert {h: r["changed"] for h, r in recap(again.stdout).items()} == dict.fromkeys(HOSTS, 0)
    up = cluster.playbook()
    assert up.returncode == 0, up.stdout[-4000:]
    assert _active_nodes(_ray_status(cluster)) == 3
    assert [ip for ip, _ in _task_on_each_node(cluster)] == sorted(cluster.ip.values())


def test_preflight_names_a_worker_whose_pins_differ(cluster: Cluster) -> None:
    bare = cluster.root / "bare-venv"  # a venv without Ray on glm5-w1
    _run(sys.executable, "-m", "venv", "--without-pip", bare)
    proc = cluster.playbook(host_vars={"glm5-w1": {"ray_cluster_venv": str(bare)}})
    assert proc.returncode != 0
    assert (
        "error: worker glm5-w1 differs from head glm5-head: packages.pip is None on glm5-w1 but "
        in proc.stdout
    )
    assert f"packages.ray is None on glm5-w1 but {RAY_VERSION} on glm5-head" in proc.stdout


def test_preflight_names_hosts_that_cannot_reach_each_other(cluster: Cluster) -> None:
    head_ip = cluster.ip[HOSTS[0]]
    cluster.in_host("glm5-w2", "ip", "route", "add", "prohibit", f"{head_ip}/32", check=True)
    try:
        proc = cluster.playbook()
    finally:
        cluster.in_host("glm5-w2", "ip", "route", "del", "prohibit", f"{head_ip}/32", check=True)
    assert proc.returncode != 0
    assert "error: Ray/NCCL ports unreachable on the cluster network:" in proc.stdout
    assert f"glm5-w2 cannot reach glm5-head at {head_ip}:6379 (" in proc.stdout
    assert "glm5-w1 cannot reach" not in proc.stdout


def test_preflight_names_a_worker_that_is_down(cluster: Cluster) -> None:
    # Down: its link is gone (no ARP answer, connections fail) and its sshd stopped.
    cluster.in_host("glm5-w2", "ip", "link", "set", "eth0", "down", check=True)
    cluster.stop_sshd("glm5-w2")
    proc = cluster.playbook()
    assert proc.returncode != 0
    assert recap(proc.stdout)["glm5-w2"]["unreachable"] == 1
    assert "error: cluster host(s) down or unreachable: glm5-w2;" in proc.stdout
