"""A real Ray cluster of three real-systemd hosts, formed by playbooks/cluster.yml (issue 9, 15).

Each host is an nspawn container booted by tests/support/nspawn_targets.py: systemd is PID 1,
it has its own network namespace on the suite's bridge (10.214.S.0/24), its own users, /etc and
nftables, and Ansible reaches its sshd over SSH from an inventory, the way `make deploy` does.
The Ray unit, its firewall unit and the Ray user are created and started for real. Ray 2.48.0
(the role's pin), the venv shared read-only by the nodes, and what cannot run here (GPUs, NCCL
across hosts, vLLM on Ray): tests/support/ray_nspawn.py.

Needs root, iproute2 and util-linux; the fixtures install systemd-container, debootstrap and
openssh-client when missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.ray_nspawn import UNIT, Cluster, changed, cluster_of, ray_venv, recap

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks/roles/ray_cluster"
BIN = Path(sys.executable).parent
HOSTS = ["glm5-head", "glm5-w1", "glm5-w2"]

pytestmark = pytest.mark.slow


def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


RAY_VERSION = _defaults()["ray_cluster_ray_version"]


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


# --- The hosts ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with cluster_of(HOSTS, HOSTS) as c:
        yield c


def _ip(c: Cluster, host: str) -> str:
    return c.nodes[host].ip


def _ray_processes(c: Cluster) -> dict[str, str]:
    """pgrep of Ray's daemons on every host ("" where none runs)."""
    return {h: c.nodes[h].run("pgrep", "-a", "-f", "raylet|gcs_server").stdout for h in HOSTS}


def _ray_status(c: Cluster, nodes: int = len(HOSTS), tries: int = 30) -> str:
    # ray.nodes() (what the role waits on) sees a node before the autoscaler's report in
    # `ray status` does; on a 2-core machine that report lags by seconds. Poll, bounded.
    venv = ray_venv()
    out = ""
    for _ in range(tries):
        proc = c.nodes[HOSTS[0]].run(
            venv / "bin/ray", "status", "--address", f"{_ip(c, HOSTS[0])}:6379", timeout=60
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
    # A driver as the vLLM service user (glm5, in the Ray group for the head's sockets), with
    # the environment cluster.yml gives vLLM (no event log: Ray's GCS makes that dir 0750).
    script = TASK_ON_EACH_NODE.format(address=f"{_ip(c, HOSTS[0])}:6379")
    proc = c.nodes[HOSTS[0]].run(
        "env", "RAY_event_log_reporter_enabled=0",
        "setpriv", "--reuid=glm5", "--regid=glm5", "--init-groups", "--",
        ray_venv() / "bin/python", "-c", script, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[:3000]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _unit_path(c: Cluster, host: str) -> Path:
    return c.nodes[host].root / "etc/systemd/system" / UNIT


# --- The proof ----------------------------------------------------------------------------
def test_check_mode_on_fresh_hosts_writes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook("--check", "--diff")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert set(recap(proc.stdout)) == set(HOSTS)
    for host in HOSTS:
        assert not _unit_path(cluster, host).exists()
    assert _ray_processes(cluster) == dict.fromkeys(HOSTS, "")


def test_converge_forms_cluster_and_runs_a_task_on_every_node(cluster: Cluster) -> None:
    proc = cluster.playbook()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert all(r["failed"] == 0 and r["changed"] > 0 for r in recap(proc.stdout).values())
    # The layout handed to vLLM: TP = GPUs per host (set: no GPUs here), PP = hosts.
    assert (
        "--distributed-executor-backend ray --tensor-parallel-size 1 --pipeline-parallel-size 3"
        in proc.stdout
    )
    for host in HOSTS:  # started by the host's own systemd
        assert cluster.nodes[host].run("systemctl", "is-active", UNIT).stdout.strip() == "active"
    status = _ray_status(cluster)
    assert _active_nodes(status) == 3, status
    assert " 0.0/3.0 CPU" in status, status
    ips = sorted(n.ip for n in cluster.nodes.values())
    assert [ip for ip, _ in _task_on_each_node(cluster)] == ips
    assert sorted(sq for _, sq in _task_on_each_node(cluster)) == [0, 1, 4]


def test_units_and_environment_are_rendered_per_host(cluster: Cluster) -> None:
    head_ip = _ip(cluster, HOSTS[0])
    for host in HOSTS:
        node = cluster.nodes[host]
        unit = _unit_path(cluster, host).read_text()
        env = (node.root / "etc/glm5/ray.env").read_text()
        assert f"--node-ip-address={node.ip}" in unit
        assert ("--head --port=6379" in unit) == (host == HOSTS[0])
        assert (f"--address={head_ip}:6379" in unit) == (host != HOSTS[0])
        assert f"VLLM_HOST_IP={node.ip}\n" in env
        assert f"RAY_ADDRESS={head_ip}:6379\n" in env
        assert "NCCL_P2P_DISABLE=1\n" in env
        verify = node.run("systemd-analyze", "verify", f"/etc/systemd/system/{UNIT}")
        assert verify.returncode == 0, verify.stderr


def test_second_converge_changes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook()
    assert changed(proc) == dict.fromkeys(HOSTS, 0)


def test_check_mode_on_converged_cluster_changes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook("--check", "--diff")
    assert changed(proc) == dict.fromkeys(HOSTS, 0)


def test_fabric_status_spans_the_cluster(cluster: Cluster) -> None:
    env = {**os.environ, "GLM5_INVENTORY": str(cluster.t.work / "inventory/hosts.yml")}
    fab = [BIN / "fab", "-c", "fabfile_cluster", "status"]
    proc = subprocess.run(fab, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for host in HOSTS:
        role = "head" if host == HOSTS[0] else "worker"
        assert f"== {host} ({role}, {_ip(cluster, host)}): glm5-ray active\n" in proc.stdout
    assert "ray nodes alive: 3/3\n" in proc.stdout


def test_teardown_is_idempotent_and_rerun_forms_the_cluster_again(cluster: Cluster) -> None:
    down = cluster.playbook("-e", "ray_cluster_state=absent")
    assert down.returncode == 0, down.stdout[-4000:]
    assert all(r["changed"] > 0 for r in recap(down.stdout).values())
    assert _ray_processes(cluster) == dict.fromkeys(HOSTS, "")
    for host in HOSTS:
        assert not _unit_path(cluster, host).exists()
    again = cluster.playbook("-e", "ray_cluster_state=absent")
    assert changed(again) == dict.fromkeys(HOSTS, 0)
    up = cluster.playbook()
    assert up.returncode == 0, up.stdout[-4000:]
    assert _active_nodes(_ray_status(cluster)) == 3
    assert [ip for ip, _ in _task_on_each_node(cluster)] == sorted(
        n.ip for n in cluster.nodes.values()
    )


def test_preflight_names_a_worker_whose_pins_differ(cluster: Cluster) -> None:
    bare = "/opt/bare-venv"  # a venv without Ray on glm5-w1
    cluster.nodes["glm5-w1"].run("python3", "-m", "venv", "--without-pip", bare, check=True)
    proc = cluster.playbook(host_vars={"glm5-w1": {"ray_cluster_venv": bare}})
    assert proc.returncode != 0
    assert (
        "error: worker glm5-w1 differs from head glm5-head: packages.pip is None on glm5-w1 but "
        in proc.stdout
    )
    assert f"packages.ray is None on glm5-w1 but {RAY_VERSION} on glm5-head" in proc.stdout


def test_preflight_names_hosts_that_cannot_reach_each_other(cluster: Cluster) -> None:
    head_ip = _ip(cluster, HOSTS[0])
    w2 = cluster.nodes["glm5-w2"]
    w2.run("ip", "route", "add", "prohibit", f"{head_ip}/32", check=True)
    try:
        proc = cluster.playbook()
    finally:
        w2.run("ip", "route", "del", "prohibit", f"{head_ip}/32", check=True)
    assert proc.returncode != 0
    assert "error: Ray/NCCL ports unreachable on the cluster network:" in proc.stdout
    assert f"glm5-w2 cannot reach glm5-head at {head_ip}:6379 (" in proc.stdout
    assert "glm5-w1 cannot reach" not in proc.stdout


def test_preflight_names_a_worker_that_is_down(cluster: Cluster) -> None:
    # Down: the host halted (its systemd shut it down), so nothing answers at its address.
    cluster.nodes["glm5-w2"].halt()
    proc = cluster.playbook()
    assert proc.returncode != 0
    assert recap(proc.stdout)["glm5-w2"]["unreachable"] == 1
    assert "error: cluster host(s) down or unreachable: glm5-w2;" in proc.stdout
