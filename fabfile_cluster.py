"""Day-2 operations on a multi-host GLM-5 deployment (vLLM over Ray) over SSH (Fabric 3).

The cluster is the inventory's glm5_head + glm5_workers groups (no second list of hosts).

    fab -c fabfile_cluster status            # Ray unit per host, alive nodes, vLLM on head
    fab -c fabfile_cluster logs --lines 200  # journal of the Ray unit (and vLLM on the head)
    fab -c fabfile_cluster restart           # vLLM down, Ray head, Ray workers, vLLM up

The inventory is $GLM5_INVENTORY, else inventory/hosts.yml, else inventory/cluster.example.yml.
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

REPO = Path(__file__).resolve().parent
VENV_BIN = REPO / ".venv" / "bin"
HEAD_GROUP, WORKER_GROUP = "glm5_head", "glm5_workers"


def inventory_path() -> Path:
    if os.environ.get("GLM5_INVENTORY"):
        return Path(os.environ["GLM5_INVENTORY"])
    real = REPO / "inventory" / "hosts.yml"
    return real if real.exists() else REPO / "inventory" / "cluster.example.yml"


@dataclass
class Node:
    name: str
    vars: dict
    head: bool

    def get(self, key: str, default: str) -> str:
        value = self.vars.get(key, default)
        return default if isinstance(value, str) and "{{" in value else str(value)

    @property
    def ip(self) -> str:
        return self.get("ray_cluster_node_ip", self.get("ansible_host", self.name))

    @property
    def ray_unit(self) -> str:
        return self.get("ray_cluster_service_name", "glm5-ray")

    @property
    def vllm_unit(self) -> str:
        return self.get("vllm_service_name", "glm5-vllm")

    @property
    def ray_bin(self) -> str:
        return self.get("ray_cluster_venv", "/opt/glm5/venv") + "/bin/ray"

    def connection(self) -> Connection:
        kwargs = {}
        if self.vars.get("ansible_ssh_private_key_file"):
            kwargs["key_filename"] = str(self.vars["ansible_ssh_private_key_file"])
        return Connection(
            host=str(self.vars.get("ansible_host", self.name)),
            user=self.vars.get("ansible_user"),
            port=int(self.vars.get("ansible_port", 22)),
            connect_kwargs=kwargs,
        )

    def run(self, cxn: Connection, command: str, **kwargs):
        kwargs.setdefault("warn", True)
        kwargs.setdefault("hide", True)
        kwargs.setdefault("in_stream", False)
        if self.vars.get("ansible_user", "root") != "root" and self.vars.get("ansible_become"):
            return cxn.sudo(command, **kwargs)
        return cxn.run(command, **kwargs)


def cluster() -> list[Node]:
    """Head first, then the workers, from `ansible-inventory --list`."""
    out = subprocess.run(
        [str(VENV_BIN / "ansible-inventory"), "-i", str(inventory_path()), "--list"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    data = json.loads(out)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    heads = data.get(HEAD_GROUP, {}).get("hosts", [])
    workers = data.get(WORKER_GROUP, {}).get("hosts", [])
    if len(heads) != 1:
        raise SystemExit(f"error: {inventory_path()}: group {HEAD_GROUP} needs exactly one host")
    return [Node(n, hostvars.get(n, {}), n in heads) for n in heads + sorted(workers)]


def alive_nodes(head: Node, cxn: Connection) -> int:
    port = head.get("ray_cluster_gcs_port", "6379")
    cmd = f"{shlex.quote(head.ray_bin)} status --address {shlex.quote(f'{head.ip}:{port}')}"
    result = head.run(cxn, cmd)
    if result.return_code != 0:
        return 0
    active = result.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return len(re.findall(r"^\s*1 node_[0-9a-f]+$", active, re.M))


@task
def status(c):
    """Show the Ray unit of every cluster host, the alive Ray nodes and vLLM on the head."""
    nodes = cluster()
    for node in nodes:
        cxn = node.connection()
        state = node.run(cxn, f"systemctl is-active {shlex.quote(node.ray_unit)}").stdout.strip()
        role = "head" if node.head else "worker"
        print(f"== {node.name} ({role}, {node.ip}): {node.ray_unit} {state or '?'}")
        if node.head:
            print(f"ray nodes alive: {alive_nodes(node, cxn)}/{len(nodes)}")
            vllm = node.run(cxn, f"systemctl is-active {shlex.quote(node.vllm_unit)}").stdout
            print(f"vllm: {node.vllm_unit} {vllm.strip() or '?'}")


@task(help={"lines": "journal lines per unit"})
def logs(c, lines=100):
    """Show the journal of the Ray unit on every cluster host (and of vLLM on the head)."""
    for node in cluster():
        cxn = node.connection()
        units = [node.ray_unit] + ([node.vllm_unit] if node.head else [])
        for unit in units:
            print(f"== {node.name}: {unit}")
            cmd = f"journalctl --no-pager -u {shlex.quote(unit)} -n {int(lines)}"
            node.run(cxn, cmd, hide=False)


@task(help={"timeout": "seconds to wait for every Ray node to join"})
def restart(c, timeout=120):
    """Restart in order: vLLM stops, Ray head, Ray workers, all nodes alive, vLLM starts."""
    nodes = cluster()
    head = nodes[0]
    head_cxn = head.connection()
    head.run(head_cxn, f"systemctl stop {shlex.quote(head.vllm_unit)}")
    for node in nodes:
        result = node.run(node.connection(), f"systemctl restart {shlex.quote(node.ray_unit)}")
        if result.return_code != 0:
            raise SystemExit(f"error: {node.name}: restart of {node.ray_unit} failed")
    deadline = time.monotonic() + int(timeout)
    while (alive := alive_nodes(head, head_cxn)) < len(nodes):
        if time.monotonic() > deadline:
            raise SystemExit(f"error: only {alive}/{len(nodes)} Ray nodes alive after {timeout} s")
        time.sleep(2)
    print(f"ray nodes alive: {alive}/{len(nodes)}")
    if head.vars.get("glm5_cluster_serve", True) not in (False, "false", "False"):
        head.run(head_cxn, f"systemctl start {shlex.quote(head.vllm_unit)}")
        print(f"{head.name}: {head.vllm_unit} started; `fab status` shows /health when it loaded")
