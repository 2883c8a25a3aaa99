"""Day-2 operations on a multi-host GLM-5 deployment (vLLM over Ray) over SSH (Fabric 3).

The cluster is the inventory's glm5_head + glm5_workers groups (no second list of hosts).

    fab -c fabfile_cluster status            # Ray unit per host, alive nodes, vLLM on head
    fab -c fabfile_cluster logs --lines 200  # journal of the Ray unit (and vLLM on the head)
    fab -c fabfile_cluster restart           # vLLM down, Ray head, Ray workers, vLLM up

Hosts and variables come from scripts/ansible_targets.py (Ansible's inventory and templar, the
roles' defaults under the inventory's). The inventory is $GLM5_INVENTORY, else
inventory/hosts.yml; never an example inventory.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass

from fabric import Connection, task
from invoke import Context

from scripts.ansible_targets import HostVars, TargetError, all_hosts, resolve


def inventory() -> str | None:
    return os.environ.get("GLM5_INVENTORY") or None


@dataclass
class Node:
    name: str
    vars: HostVars
    head: bool

    def get(self, key: str) -> str:
        return str(self.vars[key])

    @property
    def ip(self) -> str:
        try:
            ip = self.vars.get("ray_cluster_node_ip")  # its default reads facts: none here
        except Exception:  # noqa: BLE001  (any templating error: fall back to the address)
            ip = None
        if not ip or "{{" in str(ip):
            ip = self.vars.get("ansible_host") or self.name
        return str(ip)

    @property
    def ray_unit(self) -> str:
        return self.get("ray_cluster_service_name")

    @property
    def vllm_unit(self) -> str:
        return self.get("vllm_service_name")

    @property
    def ray_bin(self) -> str:
        return self.get("ray_cluster_venv") + "/bin/ray"

    def connection(self) -> Connection | Context:
        if self.vars.get("ansible_connection") == "local":
            return Context()
        kwargs = {}
        if self.vars.get("ansible_ssh_private_key_file"):
            kwargs["key_filename"] = str(self.vars["ansible_ssh_private_key_file"])
        return Connection(
            host=str(self.vars.get("ansible_host") or self.name),
            user=self.vars.get("ansible_user"),
            port=int(self.vars.get("ansible_port") or 22),
            connect_kwargs=kwargs,
        )

    def run(self, cxn: Connection | Context, command: str, **kwargs):
        kwargs.setdefault("warn", True)
        kwargs.setdefault("hide", True)
        kwargs.setdefault("in_stream", False)
        if (self.vars.get("ansible_user") or "root") != "root" and self.vars.get("ansible_become"):
            return cxn.sudo(command, **kwargs)
        return cxn.run(command, **kwargs)


def cluster() -> list[Node]:
    """Head first, then the workers, from the inventory's head and worker groups."""
    try:
        all_hosts(inventory())  # no inventory: one line saying to create it
        probe = HostVars("localhost", inventory())
        head_group = str(probe["ray_cluster_head_group"])
        worker_group = str(probe["ray_cluster_worker_group"])
        heads = resolve(head_group, inventory())
        if heads.kind != "group" or len(heads.members) != 1:
            raise TargetError(f"{heads.inventory}: group {head_group} needs exactly one host")
        try:
            workers = resolve(worker_group, inventory())
            worker_names = sorted(workers.members) if workers.kind == "group" else []
        except TargetError:
            worker_names = []  # an empty worker group: a one-host cluster
        names = heads.members + worker_names
        return [Node(n, HostVars(n, inventory()), n in heads.members) for n in names]
    except TargetError as exc:
        raise SystemExit(f"error: {exc}") from None


def alive_nodes(head: Node, cxn: Connection | Context) -> int:
    port = head.get("ray_cluster_gcs_port")
    cmd = f"{shlex.quote(head.ray_bin)} status --address {shlex.quote(f'{head.ip}:{port}')}"
    result = head.run(cxn, cmd)
    if result.return_code != 0:
        return 0
    active = result.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return len(re.findall(r"^\s*1 node_[0-9a-f]+$", active, re.M))


@task
def status(c):
    """Show the Ray unit of every host, the alive Ray nodes and vLLM on the head; exit 1 if down."""
    nodes = cluster()
    bad = []
    for node in nodes:
        cxn = node.connection()
        ray = node.run(cxn, f"systemctl is-active {shlex.quote(node.ray_unit)}")
        role = "head" if node.head else "worker"
        print(f"== {node.name} ({role}, {node.ip}): {node.ray_unit} {ray.stdout.strip() or '?'}")
        if ray.return_code != 0:
            bad.append(f"{node.name} {node.ray_unit}")
        if node.head:
            alive = alive_nodes(node, cxn)
            print(f"ray nodes alive: {alive}/{len(nodes)}")
            if alive < len(nodes):
                bad.append(f"{alive}/{len(nodes)} Ray nodes alive")
            vllm = node.run(cxn, f"systemctl is-active {shlex.quote(node.vllm_unit)}")
            print(f"vllm: {node.vllm_unit} {vllm.stdout.strip() or '?'}")
            if vllm.return_code != 0 and node.vars.get("glm5_cluster_serve", True):
                bad.append(f"{node.name} {node.vllm_unit}")
    if bad:
        raise SystemExit(f"error: cluster unhealthy: {', '.join(bad)}")


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
