"""The make targets as a user types them: HOST=, CHECK=, VARS=, set-up and the runtime env."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from support.deploy import REPO, make

LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
NO_REAL_INVENTORY = pytest.mark.skipif(
    (REPO / "inventory/hosts.yml").exists(), reason="a real inventory/hosts.yml is present"
)


@pytest.fixture
def cluster_inventory(tmp_path: Path) -> Path:
    """The README's multi-host groups, with two hosts on this machine (local connection)."""
    path = tmp_path / "hosts.yml"
    groups = {
        "glm5_head": {"hosts": {"node-a": LOCAL}},
        "glm5_workers": {"hosts": {"node-b": LOCAL}},
    }
    path.write_text(yaml.safe_dump({"all": {"children": {"glm5_cluster": {"children": groups}}}}))
    return path


@pytest.mark.slow
def test_make_deploy_host_group_runs_on_its_members(cluster_inventory: Path) -> None:
    result = make(
        "deploy",
        HOST="glm5_cluster",
        INVENTORY=str(cluster_inventory),
        ANSIBLE_ARGS="--tags preflight",
    )
    assert "targets: glm5_cluster (group in" in result.output
    assert "Found both group and host with same name" not in result.output
    assert result.recap("node-a")["failed"] == 1  # this box has no GPU: the preflight refuses
    assert result.recap("node-b")["failed"] == 1
    with pytest.raises(AssertionError, match="no PLAY RECAP line for glm5_cluster"):
        result.recap("glm5_cluster")


@NO_REAL_INVENTORY
@pytest.mark.parametrize("target", ["deploy", "verify-patches", "smoke"])
def test_placeholder_host_is_refused_before_any_connection(target: str) -> None:
    result = make(target, HOST="gpu01")
    assert result.rc != 0
    assert (
        "error: HOST=gpu01 is a placeholder of inventory/hosts.example.yml and there is no"
        " inventory/hosts.yml; create inventory/hosts.yml" in result.output
    )
    assert "PLAY" not in result.output and "192.0.2" not in result.output


@NO_REAL_INVENTORY
@pytest.mark.parametrize("target", ["status", "cluster-status"])
def test_fab_targets_without_an_inventory_say_so_in_one_line(target: str) -> None:
    result = make(target)
    assert result.rc != 0
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: no inventory: create inventory/hosts.yml (copy inventory/hosts.example.yml or"
        " cluster.example.yml and put your hosts' addresses in it), or set GLM5_INVENTORY"
    ]
    assert "Traceback" not in result.output


def test_fab_status_on_hosts_never_deployed_says_so_and_fails(cluster_inventory: Path) -> None:
    result = make("status", INVENTORY=str(cluster_inventory), HOST="glm5_cluster")
    assert result.rc != 0
    for host in ("node-a", "node-b"):
        assert f"not deployed: run make deploy HOST={host} first (missing " in result.output
        assert f"{host}: UNHEALTHY: not deployed" in result.output
    assert "error: unhealthy: node-a, node-b" in result.output
    assert "No such file or directory" not in result.output  # no raw shell error as a "state"


def test_fab_status_with_a_mistyped_inventory_is_one_error_line(tmp_path: Path) -> None:
    result = make("status", INVENTORY=str(tmp_path / "typo.yml"))
    assert result.rc != 0
    assert f"error: inventory {tmp_path}/typo.yml not found" in result.output
    assert "Traceback" not in result.output


def test_make_deploy_with_a_missing_inventory_file_is_one_error_line(tmp_path: Path) -> None:
    result = make("deploy", HOST="gpu01", INVENTORY=str(tmp_path / "typo.yml"))
    assert result.rc != 0
    assert f"error: inventory {tmp_path}/typo.yml not found" in result.output
    assert "PLAY" not in result.output


@pytest.mark.parametrize(
    ("check", "flags"), [("1", True), ("yes", True), ("0", False), ("false", False), ("", False)]
)
def test_check_means_check_mode_and_zero_means_off(check: str, flags: bool) -> None:
    dry = make("deploy", "-n", HOST="10.0.0.5", CHECK=check).output
    assert 'scripts/ansible_targets.py --host "10.0.0.5"' in dry
    assert ("--check --diff" in dry) is flags


def test_a_check_value_that_is_neither_on_nor_off_is_refused() -> None:
    result = make("deploy", CHECK="maybe")
    assert result.rc == 2
    assert "error: CHECK=maybe: use CHECK=1 (check mode) or CHECK=0 (real run)" in result.output


def test_vars_file_is_passed_quoted_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    overrides = tmp_path / "my vars.yml"
    overrides.write_text('{"vllm_service_port": 8123}\n')
    dry = make("deploy", "-n", VARS=str(overrides)).output
    assert f'-e @"$(realpath -- "{overrides}")" -e preflight_vars_file="$(realpath' in dry
    missing = make("deploy", VARS=str(tmp_path / "nope.yml"))
    assert missing.rc == 2
    assert f"error: VARS={tmp_path}/nope.yml: no such file" in missing.output


def test_bench_kernels_without_cuda_builds_no_runtime_env(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime-env"
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p)
    result = make("bench-kernels", RUNTIME_VENV=str(runtime), PATH=f"{tmp_path}/nobin:{path}")
    if "skipped: no CUDA GPU" not in result.output:
        pytest.skip("this machine has a CUDA GPU")
    assert result.rc == 0
    assert "the runtime env was not built" in result.output
    assert not runtime.exists() and not list(tmp_path.glob("runtime-env*"))


def test_a_python_outside_3_11_to_3_13_is_one_line_saying_what_to_install(tmp_path: Path) -> None:
    """A stand-in interpreter that reports 3.10 (no other Python is installed here)."""
    fake = tmp_path / "python3.10"
    fake.write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.10.12" && exit 0\nexit 1\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    result = make("setup", PYTHON=str(fake), VENV=str(venv))
    assert result.rc != 0
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: the controller needs Python 3.11, 3.12 or 3.13 ({fake} is Python 3.10.12):"
        " apt-get install python3 python3-venv, or make PYTHON=python3.12"
    ]
    assert "Traceback" not in result.output and "AssertionError" not in result.output
    assert not venv.exists()


def test_make_setup_on_a_ready_env_says_what_next(tmp_path: Path) -> None:
    """A ready env is its stamp (newer than the lock): setup builds nothing, names the next step."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(Path(os.__file__).parents[2] / "bin/python3")
    (venv / ".installed").touch()
    result = make("setup", VENV=str(venv))
    assert result.rc == 0, result.output
    assert f"controller env ready: {venv} (Python 3." in result.output
    assert "next: cp inventory/hosts.example.yml inventory/hosts.yml" in result.output


@pytest.mark.parametrize(
    ("target", "check"), [("verify-patches", ""), ("smoke", ""), ("smoke", "1")]
)
def test_day2_targets_on_a_host_never_deployed_say_so_in_one_line(
    tmp_path: Path, target: str, check: str
) -> None:
    """This box was never deployed (paths in an empty temp dir: a real /opt cannot hide that)."""
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump({"glm5_install_dir": str(tmp_path / "opt")}))
    before = sorted(tmp_path.rglob("*"))
    result = make(target, CHECK=check, VARS=str(vars_file))
    assert result.rc != 0
    assert (
        f"error: localhost: not deployed: run make deploy HOST=localhost first (missing"
        f" {tmp_path}/opt/venv/bin/python" in result.output
    )
    assert "rc: 127" not in result.output and "File not found" not in result.output
    assert result.recap("localhost")["changed"] == 0
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.slow
def test_vars_file_with_a_typo_is_warned_about(tmp_path: Path) -> None:
    vars_file = tmp_path / "overrides.yml"
    vars_file.write_text('{"vllm_service_port": 8123, "vllm_servce_port": 1, "ansible_user": "x"}')
    result = make("deploy", CHECK="1", VARS=str(vars_file), ANSIBLE_ARGS="--tags preflight")
    assert (
        f"warning: {vars_file}: unknown variable(s) vllm_servce_port: no role default or"
        " inventory/group_vars/all.yml entry has that name" in result.output
    )
    assert "vllm_service_port," not in result.output and "ansible_user" not in result.output
