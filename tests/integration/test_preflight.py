"""Preflight refusals through `make deploy` on this CPU-only machine (local connection).

Only the preflight role runs (`--tags preflight`: its tasks are tagged `always`, no other role
carries the tag). GPUs other than "none" and Secure Boot are simulated with a stand-in
nvidia-smi and a stand-in EFI variable file: the names of the tests say so.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import yaml
from support.deploy import REPO, make

NO_GPU = "no NVIDIA GPU found (no PCI device with vendor 0x10de, nvidia-smi not found)"


def _deploy(tmp_path: Path, extra: dict, check: bool = False):
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump(extra))
    args = f"-e @{vars_file} --tags preflight"
    return make("deploy", ANSIBLE_ARGS=args, **({"CHECK": "1"} if check else {}))


def _shards(tmp_path: Path, size: int) -> Path:
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in (1, 2):
        with open(shards / f"tiny-0000{i}-of-00002.gguf", "wb") as f:
            f.truncate(size)  # sparse: occupies no blocks, counts its full size
    return shards


def test_make_deploy_on_this_cpu_box_stops_with_the_no_gpu_message() -> None:
    result = make("deploy")
    assert result.rc != 0
    assert f"error: localhost: {NO_GPU}" in result.output
    assert result.recap("localhost")["changed"] == 0


def test_preflight_refusals_simulated_gpu_secure_boot_disk_os(tmp_path: Path) -> None:
    fake_smi = tmp_path / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 9.0, 580.95.05, 143771'\n")
    fake_smi.chmod(0o755)
    efivar = tmp_path / "SecureBoot"
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")  # efivarfs attributes + value 1 = enabled
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    shards = _shards(tmp_path, free)  # two shards of the free space each: cannot fit
    result = _deploy(
        tmp_path,
        {
            "preflight_nvidia_smi": str(fake_smi),
            "preflight_secure_boot_var": str(efivar),
            "preflight_supported_os": ["Ubuntu 24"],
            "gguf_weights_shard_dir": str(shards),
            "gguf_weights_merged_path": str(tmp_path / "model" / "merged.gguf"),
        },
    )
    assert result.rc != 0
    out = result.output
    assert "unsupported OS Debian 12; supported: Ubuntu 24" in out
    assert (
        "GPU 0 (NVIDIA H200) has compute capability 9.0, not one of 12.0, 12.1; the sparse MLA"
        " backend targets Blackwell SM120" in out
    )
    assert "Secure Boot is enabled and no module signing plan is declared" in out
    assert f"not enough disk for the merged model at {tmp_path}/model/merged.gguf: need " in out
    assert result.recap("localhost")["changed"] == 0


def test_preflight_accepts_the_simulated_blackwell_gpu(tmp_path: Path) -> None:
    fake_smi = tmp_path / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\necho '0, RTX PRO 6000 Blackwell, 12.0, 580.95.05, 97887'\n")
    fake_smi.chmod(0o755)
    result = _deploy(
        tmp_path,
        {
            "preflight_nvidia_smi": str(fake_smi),
            "preflight_secure_boot_var": str(tmp_path / "absent"),
            "gguf_weights_shard_dir": str(_shards(tmp_path, 1000)),
            "gguf_weights_merged_path": str(tmp_path / "merged.gguf"),
            "preflight_disk_margin_gb": 0,
            "preflight_apt_lock_files": [str(tmp_path / "free-lock")],
        },
    )
    assert result.rc == 0, result.output[-3000:]
    assert result.recap("localhost") | {"ok": 0, "skipped": 0} == {
        "ok": 0,
        "changed": 0,
        "unreachable": 0,
        "failed": 0,
        "skipped": 0,
    }


def test_preflight_waits_for_a_held_apt_lock_then_fails(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.write_text("")
    with open(lock, "r+") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)  # what dpkg/apt (unattended-upgrades) hold
        result = _deploy(
            tmp_path,
            {
                "preflight_gpu_required": False,
                "preflight_shards_required": False,
                "preflight_apt_lock_files": [str(lock)],
                "preflight_apt_lock_retries": 2,
                "preflight_apt_lock_delay": 1,
            },
        )
    assert result.rc != 0
    assert f"apt/dpkg is locked ({lock}) and stayed locked for 2 s" in result.output
    assert "unattended-upgrades" in result.output


def test_preflight_refuses_a_boolean_passed_as_a_string(tmp_path: Path) -> None:
    result = _deploy(tmp_path, {"nvidia_driver_enabled": "false"})
    assert result.rc != 0
    assert 'error: nvidia_driver_enabled is the string "false", not a boolean' in result.output


def test_make_deploy_check_runs_the_whole_play_on_this_box_and_changes_nothing(
    tmp_path: Path,
) -> None:
    vars_file = tmp_path / "vars.yml"
    # Until backend/ and scripts/ are merged there is nothing to copy; then those steps run too.
    have_backend = (REPO / "backend/pyproject.toml").is_file()
    have_merger = (REPO / "scripts/gguf_merge.py").is_file()
    vars_file.write_text(
        yaml.safe_dump(
            {"vllm_runtime_backend_install": have_backend, "gguf_weights_merge": have_merger}
        )
    )
    before = {p: p.exists() for p in (Path("/opt/glm5"), Path("/srv/glm5"), Path("/etc/glm5"))}
    result = make("deploy", CHECK="1", ANSIBLE_ARGS=f"-e @{vars_file}")
    # The whole plan shows, then check mode ends non-zero with the real run's refusal.
    assert result.rc != 0, result.output[-4000:]
    assert f"check mode: a real run would stop here: {NO_GPU}" in result.output
    verdict = "TASK [preflight : Preflight | Refuse in check mode what a real run refuses]"
    assert verdict in result.output
    assert result.output.index(verdict) > result.output.index("Service | Install the systemd unit")
    assert f"error: localhost: {NO_GPU}" in result.output
    for task in (
        "TASK [nvidia_driver : Driver | Look for the headers package of the running kernel]",
        "TASK [vllm_runtime : Runtime | Install uv into its own venv]",
        "TASK [vllm_patches : Patches | Say what a real run would do (check mode, no venv yet)]",
        "TASK [vllm_service : Service | Install the systemd unit]",
    ):
        assert task in result.output
    assert result.recap("localhost")["failed"] == 1  # the verdict, nothing else
    assert {p: p.exists() for p in before} == before  # check mode wrote nothing
