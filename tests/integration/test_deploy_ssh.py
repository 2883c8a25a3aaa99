"""`make deploy` over a real sshd on 127.0.0.1: converge, idempotence, check mode, verify, Fabric.

What cannot exist here is switched off by variables named in TARGET_SWITCHES (a GPU, NVIDIA's apt
repository, a reboot, systemd as PID 1 to start the service). Everything else runs for real: the
runtime venv checks against the cached vLLM 0.23.0 venv, the unit rendered and checked by
`systemd-analyze verify`, the API key generated on the host, the HF config files, the stamped merge
(when scripts/gguf_merge.py is merged) and patch apply/verify on a staged copy of vLLM's Python
files (when scripts/vllm_patches.py and patches/ are merged).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from support.deploy import REPO, VENV_BIN, Result, make, runtime_venv, start_sshd
from support.fake_openai_server import Behaviour, FakeOpenAIServer

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

HOST = "glm5-test"

# The explicit switches for what this machine cannot do (each named, each documented).
TARGET_SWITCHES = {
    "preflight_gpu_required": False,  # no GPU here
    "nvidia_driver_enabled": False,  # NVIDIA's apt repository is unreachable; no module to load
    "cuda_toolkit_enabled": False,  # same repository
    "vllm_runtime_venv_create": False,  # use the cached vLLM 0.23.0 runtime venv as the host venv
    "vllm_runtime_python_version": "3.11",  # ... which is Python 3.11 (hosts get 3.12)
    "vllm_runtime_backend_install": False,  # never pip install into the shared cached venv
    "vllm_service_manage_systemd": False,  # systemd is not PID 1 in this container
    "vllm_service_health_check": False,  # so no real vLLM answers /health
    "glm5_smoke_after_deploy": False,  # smoke is tested on its own against a stand-in server
}


def _write_shards(directory: Path, prefix: str = "tiny", dtype: str = "float32") -> None:
    """Three llama.cpp-style split shards written by gguf-py (tiny tensors of `dtype`)."""
    import gguf
    import numpy as np

    directory.mkdir(parents=True)
    tensors = [[("a", 3), ("b", 5)], [("c", 7)], [("d", 2), ("e", 9)]]
    total = sum(len(t) for t in tensors)
    for i, shard in enumerate(tensors):
        path = directory / f"{prefix}-{i + 1:05d}-of-{len(tensors):05d}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        if i == 0:
            writer.add_name("tiny")
        writer.add_uint16("split.no", i)
        writer.add_uint16("split.count", len(tensors))
        writer.add_int32("split.tensors.count", total)
        for name, n in shard:
            writer.add_tensor(f"{name}.weight", np.arange(n, dtype=dtype) + i)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> dict:
    venv = runtime_venv()
    if not (venv / "bin/vllm").exists():
        pytest.skip(f"runtime venv {venv} not built: run `make runtime`")
    root = tmp_path_factory.mktemp("deploy")
    sshd = start_sshd(root / "sshd")
    hf_src = root / "hf-src"
    hf_src.mkdir()
    (hf_src / "config.json").write_text(
        json.dumps({"model_type": "glm_moe_dsa", "indexer_rope_interleave": False})
    )
    (hf_src / "tokenizer_config.json").write_text("{}")
    (hf_src / "model-00001.safetensors").write_text("weights are never copied")
    _write_shards(root / "shards")
    switches = dict(TARGET_SWITCHES, gguf_weights_merge=True)
    paths = {
        "glm5_install_dir": str(root / "opt"),
        "glm5_model_dir": str(root / "srv"),
        "vllm_runtime_venv_path": str(venv),
        "gguf_weights_shard_dir": str(root / "shards"),
        "gguf_weights_hf_source_dir": str(hf_src),
        "preflight_disk_margin_gb": 0,
        "vllm_service_user": "glm5test",
        "vllm_service_home": str(root / "home"),
        "vllm_service_config_dir": str(root / "etc"),
        "vllm_service_key_file": str(root / "etc/api-key.env"),
        "vllm_service_env_file": str(root / "etc/vllm.env"),
        "vllm_service_systemd_dir": str(root / "systemd"),
        "vllm_service_port": 18000 + os.getpid() % 1000,
    }
    staged = root / "site-packages"
    src = venv / "lib/python3.11/site-packages/vllm"
    shutil.copytree(src, staged / "vllm", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    paths["vllm_patches_site_packages"] = str(staged)
    host_vars = {**switches, **paths, **sshd.ansible_vars()}
    vars_file = root / "vars.yml"
    vars_file.write_text(yaml.safe_dump(host_vars))
    inventory = root / "inventory"
    inventory.mkdir()
    (inventory / "group_vars").symlink_to(REPO / "inventory/group_vars")
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {HOST: host_vars}}}))
    state = {
        "root": root,
        "vars": host_vars,
        "sshd": sshd,
        "inventory": inventory / "hosts.yml",
        "args": f"-e @{vars_file}",
        "inv_args": "",
        "outputs": [],
    }
    yield state
    sshd.proc.terminate()
    sshd.proc.wait(timeout=10)


def _by_name(target: dict, make_target: str = "deploy", **kw: str) -> Result:
    kw.setdefault("ANSIBLE_ARGS", target["inv_args"])
    result = make(make_target, HOST=HOST, INVENTORY=str(target["inventory"]), **kw)
    target["outputs"].append(result.output)
    return result


def test_first_converge_over_ssh_to_a_bare_ip(target: dict) -> None:
    # Not in any inventory: reached as `-i "127.0.0.1,"`, with port/key/known_hosts from -e.
    result = make("deploy", HOST="127.0.0.1", ANSIBLE_ARGS=target["args"])
    target["outputs"].append(result.output)
    assert result.rc == 0, result.output[-5000:]
    assert result.recap("127.0.0.1")["changed"] > 0
    print(f"first converge: {result.seconds:.1f} s")  # noqa: T201  (figure for the report)


def test_second_converge_by_inventory_name_changes_nothing(target: dict) -> None:
    result = _by_name(target)
    assert result.rc == 0, result.output[-5000:]
    recap = result.recap(HOST)
    assert recap["changed"] == 0, result.output[-5000:]
    assert recap["failed"] == 0
    print(f"second converge: {result.seconds:.1f} s")  # noqa: T201


def test_check_diff_on_the_converged_target_reports_no_change(target: dict) -> None:
    result = _by_name(target, CHECK="1")
    assert result.rc == 0, result.output[-5000:]
    assert result.recap(HOST)["changed"] == 0, result.output[-5000:]


def test_api_key_generated_once_private_and_never_printed(target: dict) -> None:
    key_file = Path(target["vars"]["vllm_service_key_file"])
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    name, key = key_file.read_text().strip().split("=", 1)
    assert name == "VLLM_API_KEY" and len(key) >= 40
    for output in target["outputs"]:
        assert key not in output
    root = Path(target["vars"]["vllm_service_systemd_dir"]).parent
    for path in (root / "systemd/glm5-vllm.service", root / "etc/vllm.env"):
        assert key not in path.read_text()


def test_unit_is_rendered_and_passes_systemd_analyze_verify(target: dict) -> None:
    v = target["vars"]
    unit = Path(v["vllm_service_systemd_dir"]) / "glm5-vllm.service"
    text = unit.read_text()
    assert text.startswith("#")  # ansible_managed header
    assert f"ExecStart={v['vllm_runtime_venv_path']}/bin/vllm serve {v['glm5_model_dir']}/" in text
    for flag in ("--dtype float16", "--attention-backend CUSTOM", "--host 127.0.0.1"):
        assert flag in text
    assert f"EnvironmentFile={v['vllm_service_key_file']}" in text
    proc = subprocess.run(
        ["systemd-analyze", "verify", f"{unit}:glm5-vllm.service"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    env = (Path(v["vllm_service_env_file"])).read_text()
    assert "NCCL_P2P_DISABLE=1" in env


def test_hf_config_files_are_placed_with_the_gguf_override(target: dict) -> None:
    hf = Path(target["vars"]["glm5_model_dir"]) / "GLM-5-hf"
    config = json.loads((hf / "config.json").read_text())
    assert config == {"model_type": "glm_moe_dsa", "indexer_rope_interleave": True}
    assert (hf / "tokenizer_config.json").read_text() == "{}"
    assert not (hf / "model-00001.safetensors").exists()


def test_verify_playbook_passes_and_changes_nothing(target: dict) -> None:
    result = _by_name(target, "verify-patches")
    assert result.rc == 0, result.output[-5000:]
    assert result.recap(HOST)["changed"] == 0


def test_verify_playbook_detects_unit_drift(target: dict) -> None:
    unit = Path(target["vars"]["vllm_service_systemd_dir"]) / "glm5-vllm.service"
    original = unit.read_text()
    unit.write_text(original.replace("--dtype float16", "--dtype bfloat16"))
    try:
        result = _by_name(target, "verify-patches")
    finally:
        unit.write_text(original)
    assert result.rc != 0
    assert f"error: {HOST}: {unit} differs from what make deploy installs" in result.output


def test_a_unit_whose_executable_is_missing_is_refused_by_validate(target: dict) -> None:
    extra = target["root"] / "bad.yml"
    extra.write_text(yaml.safe_dump({"vllm_service_exec": "/nonexistent/vllm"}))
    result = _by_name(target, ANSIBLE_ARGS=f"--tags service -e @{extra}")
    assert result.rc != 0
    assert "Command /nonexistent/vllm is not executable" in result.output
    unit = Path(target["vars"]["vllm_service_systemd_dir"]) / "glm5-vllm.service"
    assert "/nonexistent/vllm" not in unit.read_text()


def test_health_wait_simulated_vllm_up_and_down(target: dict) -> None:
    """A stand-in HTTP server plays vLLM's /health on the service port (no systemd here)."""
    port = target["vars"]["vllm_service_port"]
    extra = target["root"] / "health.yml"
    extra.write_text(
        yaml.safe_dump(
            {
                "vllm_service_health_check": True,
                "vllm_service_health_retries": 2,
                "vllm_service_health_delay": 1,
            }
        )
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up = _by_name(target, ANSIBLE_ARGS=f"--tags service -e @{extra}")
    finally:
        server.shutdown()
        server.server_close()
    assert up.rc == 0, up.output[-4000:]
    assert up.recap(HOST)["changed"] == 0
    down = _by_name(target, ANSIBLE_ARGS=f"--tags service -e @{extra}")
    assert down.rc != 0
    url = f"http://127.0.0.1:{port}/health"
    assert f"error: {HOST}: glm5-vllm did not answer {url}" in down.output
    assert "journal lines (journalctl -u glm5-vllm)" in down.output


def test_merge_is_stamped_and_redone_only_when_a_shard_changes(target: dict) -> None:
    v = target["vars"]
    merged = Path(v["glm5_model_dir"]) / "GLM-5-Q4_K_M.gguf"
    stamp = json.loads(Path(f"{merged}.stamp.json").read_text())
    assert [s["name"] for s in stamp["shards"]] == [
        f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    assert stamp["merged"]["size"] == merged.stat().st_size
    shard = Path(v["gguf_weights_shard_dir"]) / "tiny-00002-of-00003.gguf"
    os.utime(shard, (time.time(), time.time() + 5))
    result = _by_name(target, ANSIBLE_ARGS=f"--tags model {target['inv_args']}")
    assert result.rc == 0, result.output[-4000:]
    assert result.recap(HOST)["changed"] >= 2  # merge + stamp
    assert len(list(Path(v["gguf_weights_shard_dir"]).glob("*.gguf"))) == 3  # never deleted
    again = _by_name(target, ANSIBLE_ARGS=f"--tags model {target['inv_args']}")
    assert again.recap(HOST)["changed"] == 0


def test_a_tensor_type_vllm_cannot_serve_is_refused_before_any_merge(target: dict) -> None:
    # F64 has no GGUF kernel in vLLM 0.23.0 (scripts/gguf_types_check.py); the refusal must come
    # before the merge writes a byte, and check mode must show it too (not hide it as changed=N).
    root = target["root"]
    _write_shards(root / "shards-f64", prefix="f64", dtype="float64")
    merged = root / "srv-f64/GLM-5-F64.gguf"
    extra = root / "f64.yml"
    extra.write_text(yaml.safe_dump({
        "gguf_weights_shard_dir": str(root / "shards-f64"),
        "gguf_weights_shard_glob": "f64-*.gguf",
        "gguf_weights_merged_path": str(merged),
    }))  # fmt: skip
    want = (
        f"error: {HOST}: f64-00001-of-00003.gguf: tensor a.weight has GGUF type F64, which vLLM "
        "0.23.0 cannot serve: no GGUF linear/embedding kernel takes this type"
    )
    for check in ("0", "1"):
        result = _by_name(target, ANSIBLE_ARGS=f"--tags model -e @{extra}", CHECK=check)
        assert result.rc != 0, result.output[-4000:]
        assert want in " ".join(result.output.split()), result.output[-4000:]
        assert "(4 more tensors refused)" in result.output
    assert not merged.parent.exists() or not any(merged.parent.iterdir())


def test_patch_drift_stops_verify_with_the_tools_message(target: dict) -> None:
    staged = Path(target["vars"]["vllm_patches_site_packages"])
    config = staged / "vllm/transformers_utils/config.py"
    original = config.read_bytes()
    config.write_bytes(original + b"\n# local edit\n")
    try:
        result = _by_name(target, "verify-patches")
    finally:
        config.write_bytes(original)
    assert result.rc != 0
    assert "the vLLM patch series does not verify in" in result.output
    assert "drifted" in result.output


def test_smoke_role_against_simulated_vllm_server(target: dict) -> None:
    """make smoke runs smoke_test.py on the host against a stand-in OpenAI server on the port."""
    key = Path(target["vars"]["vllm_service_key_file"]).read_text().strip().split("=", 1)[1]
    behaviour = Behaviour(models=["glm-5"], api_key=key)
    with FakeOpenAIServer(behaviour, port=target["vars"]["vllm_service_port"]) as server:
        result = _by_name(target, "smoke")
    assert result.rc == 0, result.output[-4000:]
    assert key not in result.output
    assert any(auth == f"Bearer {key}" for _, _, auth in server.requests)
    assert any(auth is None for _, _, auth in server.requests)  # the 401 check ran


def _fab(env: dict[str, str], *task: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "fab"), "-H", HOST, *task],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_smoke_in_check_mode_writes_no_report_on_the_host(target: dict) -> None:
    key = Path(target["vars"]["vllm_service_key_file"]).read_text().strip().split("=", 1)[1]
    report = Path(target["vars"]["vllm_service_home"]) / "smoke.json"
    report.unlink(missing_ok=True)
    behaviour = Behaviour(models=["glm-5"], api_key=key)
    with FakeOpenAIServer(behaviour, port=target["vars"]["vllm_service_port"]) as server:
        result = _by_name(target, "smoke", CHECK="1")
    assert result.rc == 0, result.output[-4000:]
    assert result.recap(HOST)["changed"] == 0
    assert server.requests  # the endpoint was really checked
    assert not report.exists()


def test_fabric_status_and_verify_against_the_same_sshd(target: dict) -> None:
    env = dict(os.environ, GLM5_INVENTORY=str(target["inventory"]))
    status = _fab(env, "status")
    # Deployed, but no systemd runs the service here and nothing answers /health: unhealthy.
    assert status.returncode == 1, status.stdout + status.stderr
    port = target["vars"]["vllm_service_port"]
    assert f"== {HOST}" in status.stdout
    assert "not deployed" not in status.stdout
    assert "gpu:     no nvidia-smi" in status.stdout
    assert "driver:  not loaded" in status.stdout
    assert f"health:  http://127.0.0.1:{port}/health down" in status.stdout
    assert "patches: patched: " in status.stdout
    assert f"{HOST}: UNHEALTHY: service " in status.stdout
    assert status.stderr.strip().splitlines()[-1] == f"error: unhealthy: {HOST}"
    logs = _fab(env, "logs", "--lines", "5")
    assert logs.returncode == 0 and f"== {HOST}" in logs.stdout
    verify = _fab(env, "verify", timeout=600)
    assert verify.returncode == 0, verify.stdout[-4000:] + verify.stderr
    assert f"{HOST}" in verify.stdout and "failed=0" in verify.stdout
