"""scripts/ansible_targets.py: HOST= resolved by Ansible's own inventory, never the examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ansible_targets
import pytest
import yaml

LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    cluster = {
        "children": {
            "glm5_head": {
                "hosts": {
                    "node-a": dict(LOCAL, vllm_service_port=9001, glm5_install_dir="/srv/else")
                }
            },
            "glm5_workers": {"hosts": {"node-b": LOCAL}},
        },
    }
    path.write_text(yaml.safe_dump({"all": {"children": {"glm5_cluster": cluster}}}))
    return path


@pytest.fixture
def no_real_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ansible_targets, "DEFAULT_INVENTORY", tmp_path / "absent" / "hosts.yml")


def test_a_group_targets_its_members_not_a_phantom_host(inventory: Path) -> None:
    t = ansible_targets.resolve("glm5_cluster", inventory)
    assert (t.kind, t.members) == ("group", ["node-a", "node-b"])
    assert t.options == ["-i", str(ansible_targets.LOCAL_INVENTORY), "-i", str(inventory)] + [
        "-l",
        "glm5_cluster",
    ]
    assert "glm5_cluster," not in t.options  # the old `-i "HOST,"` that shadowed the group


def test_an_inventory_host_is_limited_to_itself(inventory: Path) -> None:
    t = ansible_targets.resolve("node-b", inventory)
    assert (t.kind, t.members, t.options[-2:]) == ("host", ["node-b"], ["-l", "node-b"])


def test_only_an_unknown_name_is_reached_as_a_bare_host(inventory: Path) -> None:
    t = ansible_targets.resolve("10.0.0.5", inventory)
    assert t.kind == "bare"
    assert t.options[-4:] == ["-i", "10.0.0.5,", "-l", "10.0.0.5"]


def test_localhost_needs_no_inventory(no_real_inventory: None) -> None:
    t = ansible_targets.resolve("localhost")
    assert t.options == ["-i", str(ansible_targets.LOCAL_INVENTORY), "-l", "localhost"]


@pytest.mark.parametrize("name", ["gpu01", "glm5_cluster", "glm5_head", "gpu02"])
def test_placeholder_hosts_of_the_examples_are_refused(no_real_inventory: None, name: str) -> None:
    with pytest.raises(ansible_targets.TargetError, match=f"HOST={name} is a placeholder of"):
        ansible_targets.resolve(name)
    with pytest.raises(ansible_targets.TargetError, match="no inventory: create inventory/hosts"):
        ansible_targets.all_hosts()


def test_a_missing_explicit_inventory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ansible_targets.TargetError, match=f"inventory {tmp_path}/typo not found"):
        ansible_targets.resolve("gpu01", tmp_path / "typo")


def test_host_vars_are_role_defaults_under_the_inventory_rendered_by_ansible(
    inventory: Path,
) -> None:
    a = ansible_targets.HostVars("node-a", inventory)
    assert a["vllm_service_name"] == "glm5-vllm"  # role default, not restated anywhere
    assert a["vllm_service_port"] == 9001  # host var over the role default
    assert a["vllm_runtime_venv_path"] == "/srv/else/venv"  # group_vars' Jinja, rendered
    bare = ansible_targets.HostVars("10.0.0.9", inventory)
    assert bare["vllm_runtime_venv_path"] == "/opt/glm5/venv"  # group_vars/all.yml still applies
    with pytest.raises(ansible_targets.TargetError, match="variable nope is defined nowhere"):
        a["nope"]


def test_cli_prints_options_members_and_one_error_line(inventory: Path, tmp_path: Path) -> None:
    script = Path(ansible_targets.__file__)
    run = [sys.executable, str(script), "--inventory", str(inventory), "--host"]
    members = subprocess.run([*run, "glm5_cluster", "--members"], capture_output=True, text=True)
    assert (members.returncode, members.stdout) == (0, "node-a\nnode-b\n")
    echoed = subprocess.run(
        [*run, "node-a", "--", "echo", "playbook.yml"], capture_output=True, text=True
    )
    assert echoed.returncode == 0
    assert echoed.stdout.split()[-3:] == ["-l", "node-a", "playbook.yml"]
    assert echoed.stderr == f"targets: node-a (host in {inventory})\n"
    bad = [sys.executable, str(script), "--inventory", str(tmp_path / "typo"), "--host", "x"]
    missing = subprocess.run(bad, capture_output=True, text=True)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: inventory ") and missing.stderr.count("\n") == 1
