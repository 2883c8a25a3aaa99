"""Ray cluster hosts as real-systemd nspawn nodes (tests/support/nspawn_targets.py), for the
Ray tests: the cached Ray venv the nodes share, the inventory and the playbook run.

Ray 2.48.0 (the role's pin) is a venv cached on the host, built with the Debian Python the nodes
share, and bind-mounted read-only into them (the nodes reach no package index). No GPU: vLLM on
Ray is switched off by the group variables in GROUP_VARS, each with its reason.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from support import nspawn_targets
from support.deploy import REPO, VENV_BIN
from support.nspawn_targets import Node, Targets

ROLE = REPO / "playbooks/roles/ray_cluster"
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
    """MEMBERS[0] is the head, the rest workers; other nodes in NODES are not in the inventory."""

    def __init__(self, t: Targets, nodes: dict[str, Node], members: list[str]) -> None:
        self.t, self.nodes, self.members = t, nodes, members

    def inventory(self, host_vars: dict[str, dict] | None = None) -> Path:
        inv = self.t.work / "inventory"
        (inv / "group_vars").mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "inventory/group_vars/all.yml", inv / "group_vars/all.yml")
        hosts = {}
        for name in self.members:
            node = self.nodes[name]
            hosts[name] = {**node.ansible_vars(), "ray_cluster_node_ip": node.ip}
            hosts[name].update((host_vars or {}).get(name, {}))
        doc = {"all": {"children": {"glm5_cluster": {"children": {
            "glm5_head": {"hosts": {self.members[0]: hosts[self.members[0]]}},
            "glm5_workers": {"hosts": {h: hosts[h] for h in self.members[1:]}},
        }}}}}  # fmt: skip
        (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
        (inv / "group_vars/glm5_cluster.yml").write_text(yaml.safe_dump(GROUP_VARS))
        return inv / "hosts.yml"

    def playbook(self, *args: str, host_vars: dict[str, dict] | None = None):
        """ansible-playbook playbooks/cluster.yml ARGS over SSH, a fresh SSH master per run."""
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


@contextmanager
def cluster_of(names: list[str], members: list[str]) -> Iterator[Cluster]:
    """Real-systemd nspawn nodes NAMES sharing the Ray venv, MEMBERS of them in the inventory;
    skips the test where the host cannot run them, and checks nothing is left behind."""
    reason = nspawn_targets.host_requirements()
    if reason:
        import pytest

        pytest.skip(reason)
    venv = ray_venv()
    with nspawn_targets.targets() as t:
        nodes = {n: t.add(n, binds=(str(venv),)) for n in names}
        yield Cluster(t, nodes, members)
        left = t
    assert left.leftovers() == []


def recap(out: str) -> dict[str, dict[str, int]]:
    pattern = r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
    return {
        m[1]: {"changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in re.finditer(pattern, out, re.M)
    }


def changed(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """Per host, the changed count of a playbook run that must have succeeded."""
    assert proc.returncode == 0, proc.stdout[-4000:]
    return {host: r["changed"] for host, r in recap(proc.stdout).items()}


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
