"""Ray is not exposed (issue 16): members-only nftables rules, no public address, its own user.

Three real-systemd nspawn nodes on the suite's own bridge (tests/support/nspawn_targets.py):
glm5-head and glm5-w1 form a Ray cluster through playbooks/cluster.yml, with the Ray unit, its
firewall unit and its user created for real; `outsider` is on the same network but not a member.
Ray 2.48.0 (the role's pin) is a venv cached on the host, built with the Debian Python the nodes
share, and bind-mounted read-only into them (the nodes reach no package index). No GPU: vLLM on
Ray is switched off by the group variables in GROUP_VARS, each with its reason.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from deploy_helpers import REPO, VENV_BIN
from support import nspawn_targets
from support.nspawn_targets import Node, Targets

pytestmark = pytest.mark.slow

ROLE = REPO / "playbooks/roles/ray_cluster"
MEMBERS = ["glm5-head", "glm5-w1"]
OUTSIDER = "outsider"
UNIT = "glm5-ray.service"
RAY_VERSION = yaml.safe_load((ROLE / "defaults/main.yml").read_text())["ray_cluster_ray_version"]
# Outside /root (ProtectHome hides it from the Ray unit) and built with the nodes' Python.
RAY_VENV = Path("/var/cache/glm5-sm120") / f"ray-{RAY_VERSION}-debian12"
GROUP_VARS = {
    "ansible_user": "root",
    "ansible_python_interpreter": "/usr/bin/python3",
    "ray_cluster_venv": str(RAY_VENV),
    "ray_cluster_install": False,  # the venv is a read-only bind; the nodes reach no PyPI
    "ray_cluster_ray_extras": [],  # cgraph pulls cupy (CUDA)
    # The role defaults, not group_vars/all.yml's "Ray runs as the vLLM user" (issue 16).
    "ray_cluster_user": "glm5-ray",
    "ray_cluster_group": "glm5-ray",
    "ray_cluster_preflight_gpu": False,  # no GPU, no nvidia-smi
    "ray_cluster_preflight_packages": ["ray", "pip"],
    "ray_cluster_preflight_timeout": 6,
    "ray_cluster_num_cpus": 1,
    "ray_cluster_num_gpus": 0,
    "ray_cluster_object_store_memory": 80_000_000,
    "glm5_cluster_tensor_parallel_size": 1,
    "glm5_cluster_serve": False,  # vLLM on Ray needs GPUs on every host
}


def ray_venv() -> Path:
    """Ray's pinned venv, built once (under a lock) with /usr/bin/python3.11 like the nodes'."""
    if (RAY_VENV / ".installed").exists():
        return RAY_VENV
    RAY_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(RAY_VENV.parent / f"{RAY_VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (RAY_VENV / ".installed").exists():
            # A venv is not relocatable (absolute shebangs): built in place, marked when complete.
            shutil.rmtree(RAY_VENV, ignore_errors=True)
            subprocess.run(["/usr/bin/python3.11", "-m", "venv", RAY_VENV], check=True)
            pip = [RAY_VENV / "bin/pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, f"ray=={RAY_VERSION}"], check=True, timeout=900)
            (RAY_VENV / ".installed").touch()
    return RAY_VENV


class Cluster:
    def __init__(self, t: Targets, nodes: dict[str, Node]) -> None:
        self.t, self.nodes = t, nodes

    def inventory(self, host_vars: dict[str, dict] | None = None) -> Path:
        inv = self.t.work / "inventory"
        (inv / "group_vars").mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "inventory/group_vars/all.yml", inv / "group_vars/all.yml")
        hosts = {}
        for name in MEMBERS:
            node = self.nodes[name]
            hosts[name] = {**node.ansible_vars(), "ray_cluster_node_ip": node.ip}
            hosts[name].update((host_vars or {}).get(name, {}))
        doc = {"all": {"children": {"glm5_cluster": {"children": {
            "glm5_head": {"hosts": {MEMBERS[0]: hosts[MEMBERS[0]]}},
            "glm5_workers": {"hosts": {h: hosts[h] for h in MEMBERS[1:]}},
        }}}}}  # fmt: skip
        (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
        (inv / "group_vars/glm5_cluster.yml").write_text(yaml.safe_dump(GROUP_VARS))
        return inv / "hosts.yml"

    def playbook(self, *args: str, host_vars: dict[str, dict] | None = None):
        env = {
            **os.environ,
            "ANSIBLE_SSH_CONTROL_PATH_DIR": tempfile.mkdtemp(prefix="cp", dir=self.t.work),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }
        cmd = [VENV_BIN / "ansible-playbook", "-i", self.inventory(host_vars),
               REPO / "playbooks/cluster.yml", *args]  # fmt: skip
        return subprocess.run(
            [str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )


def recap(out: str) -> dict[str, dict[str, int]]:
    pattern = r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
    return {
        m[1]: {"changed": int(m[3]), "failed": int(m[5])} for m in re.finditer(pattern, out, re.M)
    }


CONNECT = """
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print(type(exc).__name__)
"""


def connect(node: Node, ip: str, port: int) -> str:
    return node.run("python3", "-c", CONNECT, ip, str(port), timeout=30).stdout.strip()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = nspawn_targets.host_requirements()
    if reason:
        pytest.skip(reason)
    venv = ray_venv()
    with nspawn_targets.targets() as t:
        nodes = {n: t.add(n, binds=(str(venv),)) for n in [*MEMBERS, OUTSIDER]}
        c = Cluster(t, nodes)
        proc = c.playbook()
        assert proc.returncode == 0, proc.stdout[-6000:]
        c.converge = proc  # type: ignore[attr-defined]
        yield c
        left = t
    assert left.leftovers() == []


def test_public_address_filter() -> None:
    spec = importlib.util.spec_from_file_location("f", ROLE / "filter_plugins/ray_cluster_net.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    public = module.ray_cluster_is_public
    assert public("8.8.8.8") and public("2001:4860:4860::8888")
    for private in ("10.0.0.5", "172.16.3.4", "192.168.1.2", "100.64.0.1", "127.0.0.1",
                    "169.254.1.1", "192.0.2.10", "fd00::1", "fe80::1", "", "gpu01"):  # fmt: skip
        assert not public(private), private


def test_members_form_the_cluster_as_the_ray_user_under_systemd(cluster: Cluster) -> None:
    assert {h: r["failed"] for h, r in recap(cluster.converge.stdout).items()} == dict.fromkeys(
        MEMBERS, 0
    )
    for name in MEMBERS:
        node = cluster.nodes[name]
        assert node.run("systemctl", "is-active", UNIT).stdout.strip() == "active"
        pid = node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
        assert node.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip() == "glm5-ray"
        # The vLLM service user is another account, in the Ray group only for the sockets.
        ids = node.run("id", "glm5").stdout
        assert "uid=" in ids and "(glm5-ray)" in ids and "uid=0" not in ids
        assert node.run("id", "-u", "glm5").stdout != node.run("id", "-u", "glm5-ray").stdout
    # The role itself waited until every member was alive in the head's GCS: members work
    # through the firewall.
    assert "Service | Every node is alive in the cluster" in cluster.converge.stdout


def test_ray_ports_refuse_a_non_member_and_accept_members(cluster: Cluster) -> None:
    head, w1 = cluster.nodes[MEMBERS[0]], cluster.nodes[MEMBERS[1]]
    outsider = cluster.nodes[OUTSIDER]
    assert connect(w1, head.ip, 6379) == "open"
    assert connect(head, w1.ip, 6380) == "open"  # the worker's raylet
    for port in (6379, 6380, 10001):
        assert connect(outsider, head.ip, port) == "refused", port
    assert connect(outsider, w1.ip, 6380) == "refused"
    # Not a Ray port: the rules leave the rest of the host alone (sshd answers the outsider).
    assert connect(outsider, head.ip, 22) == "open"
    rules = head.run("nft", "list", "table", "inet", "glm5_ray").stdout
    assert f"elements = {{ {head.ip}, {w1.ip} }}" in rules, rules
    assert "10001-10999" in rules  # client server + worker ports (nft merges the ranges)


def test_ray_unit_exposure_at_most_5(cluster: Cluster) -> None:
    head = cluster.nodes[MEMBERS[0]]
    out = head.run("systemd-analyze", "security", "--no-pager", UNIT, check=True).stdout
    found = re.search(rf"Overall exposure level for {UNIT}: (\d+\.\d+) ", out)
    assert found, out[-2000:]
    assert float(found.group(1)) <= 5.0


def test_public_node_ip_is_refused_unless_the_inventory_allows_it(cluster: Cluster) -> None:
    proc = cluster.playbook(host_vars={MEMBERS[1]: {"ray_cluster_node_ip": "8.8.8.8"}})
    assert proc.returncode != 0
    assert (
        f"error: {MEMBERS[1]}: ray_cluster_node_ip 8.8.8.8 is a public address, and Ray has no "
        "authentication" in proc.stdout
    )
    allowed = cluster.playbook(
        "--check",
        host_vars={MEMBERS[1]: {"ray_cluster_node_ip": "8.8.8.8",
                                "ray_cluster_allow_public_ip": True}},
    )  # fmt: skip
    assert "is a public address" not in allowed.stdout


def test_second_converge_changes_nothing(cluster: Cluster) -> None:
    proc = cluster.playbook()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {h: r["changed"] for h, r in recap(proc.stdout).items()} == dict.fromkeys(MEMBERS, 0)


def test_teardown_unloads_the_firewall(cluster: Cluster) -> None:
    proc = cluster.playbook("-e", "ray_cluster_state=absent")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for name in MEMBERS:
        node = cluster.nodes[name]
        assert node.run("nft", "list", "table", "inet", "glm5_ray").returncode != 0
        assert not (node.root / "etc/systemd/system/glm5-ray-firewall.service").exists()
        assert node.run("systemctl", "is-active", UNIT).stdout.strip() != "active"
