"""`make deploy HOST=gpu01` as a user types it, against a real-systemd nspawn container (issue 15).

The target is a Debian 12 container booted by tests/support/nspawn_targets.py: systemd is PID 1,
Ansible reaches its sshd over the suite's own bridge, and the vllm_service role runs for real
(unit installed, enabled and started by systemd, the restart handler with its /health wait,
Restart=on-failure after a kill, `systemctl status`).

Stand-ins, each named in the test names: `vllm serve` (tests/support/vllm_serve_standin.py, no
GPU to load GLM-5 on) installed where the runtime role would put vLLM; the model file and HF
config dir the model role would leave. What stays off is in SWITCHES, each with its reason.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import nspawn_targets, nvidia_repo_standin
from support.deploy import REPO, Result, make
from support.nspawn_targets import Node, Targets

pytestmark = pytest.mark.slow

HOST = "gpu01"
UNIT = "glm5-vllm.service"
STANDIN = REPO / "tests/support/vllm_serve_standin.py"
# What this machine cannot run, switched off by name (the roles' own variables).
SWITCHES = {
    "preflight_gpu_required": False,  # no GPU in the container
    "nvidia_driver_enabled": False,  # test_nvidia_roles_standin_repo runs these roles
    "cuda_toolkit_enabled": False,
    "glm5_smoke_after_deploy": False,  # the smoke role has its own tests
    "vllm_service_health_delay": 1,  # the stand-in answers in well under a second
    "vllm_service_health_retries": 30,
}
# runtime/patches/model install vLLM 0.23.0 (9 GB) and merge a GGUF: the stand-in and a small
# model file take their place (seed_runtime_standin).
SKIP_TAGS = "runtime,patches,model"


def seed_runtime_standin(node: Node) -> None:
    """Leave what the runtime and model roles would: `vllm` (the stand-in), model, HF config."""
    venv_bin = node.root / "opt/glm5/venv/bin"
    venv_bin.mkdir(parents=True)
    shutil.copy(STANDIN, venv_bin / "vllm")
    (venv_bin / "vllm").chmod(0o755)
    model_dir = node.root / "srv/glm5"
    (model_dir / "GLM-5-hf").mkdir(parents=True)
    (model_dir / "GLM-5-Q4_K_M.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(56))
    (model_dir / "GLM-5-hf/config.json").write_text('{"architectures": ["GlmMoeDsaForCausalLM"]}')


def write_inventory(t: Targets, hosts: dict[str, dict[str, object]]) -> Path:
    """inventory/hosts.yml as a user writes it (plus the repository's group_vars/all.yml)."""
    inv = t.work / "inventory"
    (inv / "group_vars").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "inventory/group_vars/all.yml", inv / "group_vars/all.yml")
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return inv / "hosts.yml"


def deploy(inventory: Path, *args: str, check: bool = False, host: str = HOST) -> Result:
    flags = " ".join(("--skip-tags", SKIP_TAGS, *args))
    extra = {"CHECK": "1"} if check else {}
    return make("deploy", HOST=host, INVENTORY=str(inventory), ANSIBLE_ARGS=flags, **extra)


def main_pid(node: Node) -> int:
    out = node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT, check=True).stdout
    return int(out.strip())


def health(node: Node) -> str:
    """HTTP status of /health from inside the container ("000": nothing listens)."""
    return node.run(
        "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5",
        "http://127.0.0.1:8000/health",
    ).stdout  # fmt: skip


def wait_for(what: str, probe, timeout: float = 60) -> object:
    """Poll PROBE until it returns something truthy (bounded); fail naming WHAT."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[Targets, Node, Path]]:
    reason = nspawn_targets.host_requirements()
    if reason:
        pytest.skip(reason)
    with nspawn_targets.targets() as t, pytest.MonkeyPatch.context() as env:
        # make deploy's SSH masters under the suite's work dir, so teardown ends them.
        env.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(t.work / "cp"))
        node = t.add(HOST)
        seed_runtime_standin(node)
        inventory = write_inventory(t, {HOST: {**node.ansible_vars(), **SWITCHES}})
        yield t, node, inventory
        left_after = t
    assert left_after.leftovers() == []


@pytest.fixture(scope="module")
def deployed(target: tuple[Targets, Node, Path]) -> tuple[Node, Path, Result]:
    _, node, inventory = target
    result = deploy(inventory)
    assert result.rc == 0, result.output[-6000:]
    return node, inventory, result


def test_deploy_starts_vllm_serve_standin_under_real_systemd(deployed) -> None:
    node, _, result = deployed
    assert result.recap(HOST)["failed"] == 0
    assert node.run("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
    assert node.run("systemctl", "is-active", UNIT).stdout.strip() == "active"
    assert health(node) == "200"
    pid = main_pid(node)
    status = node.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip()
    assert status == "glm5"  # the service user, not root
    cmdline = node.run("cat", f"/proc/{pid}/cmdline").stdout
    assert "/opt/glm5/venv/bin/vllm\0serve\0/srv/glm5/GLM-5-Q4_K_M.gguf" in cmdline
    # `systemctl status` as an operator reads it.
    status = node.run("systemctl", "status", "--no-pager", "--lines=20", UNIT).stdout
    assert f"Loaded: loaded (/etc/systemd/system/{UNIT}; enabled;" in status
    assert re.search(r"Active: active \(running\) since ", status), status
    assert f"Main PID: {pid} (vllm)" in status
    assert "vllm-serve-standin: serving glm-5 on 127.0.0.1:8000" in status


def test_vllm_serve_standin_guards_v1_with_the_generated_key(deployed) -> None:
    node, _, _ = deployed
    key_line = (node.root / "etc/glm5/api-key.env").read_text().strip()
    key = key_line.removeprefix("VLLM_API_KEY=")
    assert len(key) >= 32 and key != key_line
    url = "http://127.0.0.1:8000/v1/models"
    denied = node.run("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url).stdout
    assert denied == "401"
    allowed = node.run("curl", "-s", "-H", f"Authorization: Bearer {key}", url).stdout
    assert '"id": "glm-5"' in allowed


def test_second_deploy_changes_nothing(deployed) -> None:
    node, inventory, _ = deployed
    pid = main_pid(node)
    again = deploy(inventory)
    assert again.rc == 0, again.output[-4000:]
    assert again.recap(HOST)["changed"] == 0, again.output[-4000:]
    assert main_pid(node) == pid  # not restarted


def test_check_diff_on_deployed_host_changes_nothing(deployed) -> None:
    node, inventory, _ = deployed
    pid = main_pid(node)
    check = deploy(inventory, check=True)
    assert check.rc == 0, check.output[-4000:]
    assert check.recap(HOST)["changed"] == 0, check.output[-4000:]
    assert main_pid(node) == pid


def test_restart_on_failure_after_kill_of_vllm_serve_standin(deployed) -> None:
    node, _, _ = deployed
    before = main_pid(node)
    node.run("kill", "-9", str(before), check=True)
    # RestartSec=30 in the unit: systemd brings it back by itself, no Ansible involved.
    after = wait_for("a new MainPID after kill -9", lambda: main_pid(node) not in (0, before), 60)
    assert after
    wait_for("/health 200 after the restart", lambda: health(node) == "200", 30)
    restarts = node.run("systemctl", "show", "-p", "NRestarts", "--value", UNIT).stdout.strip()
    assert int(restarts) >= 1


def test_config_change_restarts_through_the_handler_and_waits_for_health(deployed) -> None:
    node, inventory, _ = deployed
    before = main_pid(node)
    doc = yaml.safe_load(inventory.read_text())
    doc["all"]["hosts"][HOST]["vllm_service_extra_env"] = {"GLM5_TEST_MARK": "handler"}
    inventory.write_text(yaml.safe_dump(doc))
    result = deploy(inventory)
    assert result.rc == 0, result.output[-4000:]
    assert result.recap(HOST)["changed"] == 2  # the env file, and the handler restart
    assert "RUNNING HANDLER [vllm_service : Service | Restart vLLM]" in result.output
    assert "Service | Poll /health until the model is loaded" in result.output
    after = main_pid(node)
    assert after != before
    environ = node.run("cat", f"/proc/{after}/environ").stdout.split("\0")
    assert "GLM5_TEST_MARK=handler" in environ
    assert health(node) == "200"


def security_exposure(node: Node, unit: str) -> float:
    """`systemd-analyze security UNIT` run by the container's own systemd: the overall score."""
    out = node.run("systemd-analyze", "security", "--no-pager", unit, check=True).stdout
    found = re.search(rf"Overall exposure level for {re.escape(unit)}: (\d+\.\d+) ", out)
    assert found, out[-2000:]
    return float(found.group(1))


def test_vllm_unit_exposure_at_most_5_and_still_serves(deployed) -> None:
    node, _, _ = deployed
    assert security_exposure(node, UNIT) <= 5.0
    unit = (node.root / "etc/systemd/system" / UNIT).read_text()
    # CUDA's needs stay: NVIDIA device classes allowed, no W^X ban for the JIT, devices not hidden.
    for line in (
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "DeviceAllow=char-nvidia-uvm rw",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/glm5",
        "CapabilityBoundingSet=",
    ):
        assert f"\n{line}\n" in unit, line
    assert "\nMemoryDenyWriteExecute=" not in unit and "\nPrivateDevices=" not in unit
    # The sandboxed stand-in read the model and HF config, and wrote its cache (vLLM does too).
    assert health(node) == "200"
    started = node.root / "var/lib/glm5/vllm/standin-started"
    assert started.read_text().strip() == str(main_pid(node))
    # What the sandbox takes away, seen from inside the running service.
    pid = str(main_pid(node))
    caps = node.run("grep", "^CapBnd:", f"/proc/{pid}/status").stdout.split()[1]
    assert int(caps, 16) == 0


# --- The NVIDIA roles for real, against the stand-in repository ------------------------------
GPU_HOST = "gpu02"
REPO_PORT = 8765


def dpkg_versions(node: Node, *packages: str) -> dict[str, str]:
    out = node.run("dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Status}\\n",
                   *packages).stdout  # fmt: skip
    return {p: v for p, v, status in (line.split() for line in out.splitlines())
            if status == "installed"}  # fmt: skip


@pytest.fixture(scope="module")
def nvidia_deployed(target: tuple[Targets, Node, Path]) -> tuple[Node, Path, Result]:
    t, _, _ = target
    url = f"http://{t.gateway}:{REPO_PORT}"
    repo = t.work / "repo"
    keyring = nvidia_repo_standin.build(repo, url, distdir="debian12")
    t.serve(repo, REPO_PORT)
    node = t.add(GPU_HOST)
    seed_runtime_standin(node)
    nvidia_repo_standin.point_node_at_distro_standin(node.root, keyring, url)
    node.run("apt-get", "update", "-q", check=True)  # a real host has its archive's lists
    hostvars = {
        **node.ansible_vars(),
        **SWITCHES,
        "nvidia_driver_enabled": True,
        "cuda_toolkit_enabled": True,
        "nvidia_driver_repo_base": f"{url}/compute/cuda/repos",
        "nvidia_driver_reboot_allowed": True,  # the container restarts: a real reboot
        "nvidia_driver_reboot_timeout": 120,
    }
    inventory = write_inventory(t, {GPU_HOST: hostvars})
    boot_id = node.run("cat", "/proc/sys/kernel/random/boot_id").stdout.strip()
    result = deploy(inventory, host=GPU_HOST)
    assert result.rc == 0, result.output[-6000:]
    node.boots_seen = boot_id  # type: ignore[attr-defined]
    return node, inventory, result


def test_nvidia_roles_install_standin_repo_packages_and_reboot(nvidia_deployed) -> None:
    node, _, result = nvidia_deployed
    assert dpkg_versions(node, *nvidia_repo_standin.PACKAGES) == nvidia_repo_standin.PACKAGES
    assert (
        "RUNNING HANDLER [nvidia_driver : Driver | Reboot to load the new module]" in result.output
    )
    # A real reboot: the container's systemd started again (new boot id, nspawn exited 133).
    boot_id = node.run("cat", "/proc/sys/kernel/random/boot_id").stdout.strip()
    assert boot_id and boot_id != node.boots_seen  # type: ignore[attr-defined]
    assert "[supervisor] nspawn rc=133" in (node.dir / "console.log").read_text()
    smi = node.run("nvidia-smi", "--query-gpu=name,driver_version,compute_cap").stdout
    assert ", 580.95.05, 12.0" in smi
    nvcc = node.run("/usr/local/cuda-13.0/bin/nvcc", "--version").stdout
    assert "release 13.0" in nvcc
    assert node.run("systemctl", "is-active", "nvidia-persistenced").stdout.strip() == "active"
    # ... and the service came up after it, under systemd.
    assert node.run("systemctl", "is-active", UNIT).stdout.strip() == "active"
    assert health(node) == "200"


def test_nvidia_standin_second_converge_and_check_diff_change_nothing(nvidia_deployed) -> None:
    node, inventory, _ = nvidia_deployed
    boot_id = node.run("cat", "/proc/sys/kernel/random/boot_id").stdout.strip()
    again = deploy(inventory, host=GPU_HOST)
    assert again.rc == 0, again.output[-4000:]
    assert again.recap(GPU_HOST)["changed"] == 0, again.output[-4000:]
    check = deploy(inventory, host=GPU_HOST, check=True)
    assert check.rc == 0, check.output[-4000:]
    assert check.recap(GPU_HOST)["changed"] == 0, check.output[-4000:]
    assert node.run("cat", "/proc/sys/kernel/random/boot_id").stdout.strip() == boot_id


# --- Ubuntu 24.04, the production OS (Python 3.12, systemd 255) ------------------------------
UBUNTU_HOST = "gpu03"


def test_ubuntu2404_deploy_runs_vllm_serve_standin_sandboxed(target) -> None:
    t, _, _ = target
    node = t.add(UBUNTU_HOST, distro="ubuntu2404")
    assert 'VERSION_ID="24.04"' in (node.root / "etc/os-release").read_text()
    seed_runtime_standin(node)
    inventory = write_inventory(t, {UBUNTU_HOST: {**node.ansible_vars(), **SWITCHES}})
    result = deploy(inventory, host=UBUNTU_HOST)
    assert result.rc == 0, result.output[-6000:]
    assert node.run("systemctl", "is-active", UNIT).stdout.strip() == "active"
    assert health(node) == "200"
    version = node.run("python3", "-c", "import sys; print(sys.version_info[:2])").stdout
    assert version == "(3, 12)\n"
    assert security_exposure(node, UNIT) <= 5.0
    again = deploy(inventory, host=UBUNTU_HOST)
    assert again.rc == 0 and again.recap(UBUNTU_HOST)["changed"] == 0, again.output[-4000:]
