"""Ray is not exposed (issue 16): members-only nftables rules, no public address, its own user.

Three real-systemd nspawn nodes on the suite's own bridge (tests/support/nspawn_targets.py):
glm5-head and glm5-w1 form a Ray cluster through playbooks/cluster.yml, with the Ray unit, its
firewall unit and its user created for real; `outsider` is on the same network but not a member.
Ray, its venv and what is switched off: tests/support/ray_nspawn.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from support.ray_nspawn import ROLE, UNIT, Cluster, changed, cluster_of, connect, recap

pytestmark = pytest.mark.slow

MEMBERS = ["glm5-head", "glm5-w1"]
OUTSIDER = "outsider"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with cluster_of([*MEMBERS, OUTSIDER], MEMBERS) as c:
        proc = c.playbook()
        assert proc.returncode == 0, proc.stdout[-6000:]
        c.converge = proc  # type: ignore[attr-defined]
        yield c


def test_public_address_filter() -> None:
    # through Ansible's own filter loader, as a play finds it
    from ansible.plugins.loader import filter_loader

    filter_loader.add_directory(str(ROLE / "filter_plugins"))
    public = filter_loader.get("ray_cluster_is_public").j2_function
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
    for unit in (UNIT, "glm5-ray-firewall.service"):
        out = head.run("systemd-analyze", "security", "--no-pager", unit, check=True).stdout
        found = re.search(rf"Overall exposure level for {unit}: (\d+\.\d+) ", out)
        assert found, out[-2000:]
        assert float(found.group(1)) <= 5.0, unit


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
    assert changed(proc) == dict.fromkeys(MEMBERS, 0)


def test_teardown_unloads_the_firewall(cluster: Cluster) -> None:
    proc = cluster.playbook("-e", "ray_cluster_state=absent")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for name in MEMBERS:
        node = cluster.nodes[name]
        assert node.run("nft", "list", "table", "inet", "glm5_ray").returncode != 0
        assert not (node.root / "etc/systemd/system/glm5-ray-firewall.service").exists()
        assert node.run("systemctl", "is-active", UNIT).stdout.strip() != "active"
