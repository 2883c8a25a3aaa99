"""The patch, model and smoke roles for real on an Ubuntu 24.04 nspawn target; `make setup` there.

`make deploy HOST=gpu05` as a user types it, against a real-systemd Ubuntu 24.04 container (the
production OS, Python 3.12; tests/support/nspawn_targets.py), with every role but the runtime
role (its 9 GB torch/CUDA install) and the NVIDIA ones (tests/integration/test_deploy_nspawn.py
runs those against the stand-in repository):

- vllm_patches applies the real series to vLLM 0.23.0's own wheel, pip-installed (--no-deps) in
  the container's /opt/glm5/venv: every touched file goes from MANIFEST's "before" sha256 to its
  "after" one;
- gguf_weights merges real split shards (gguf-py's GGUFWriter, llama.cpp's split keys) into the
  model dir: the merged file is byte for byte what llama.cpp's llama-gguf-split --merge makes of
  the same shards, and its tensors are the shards' data;
- vllm_smoke runs the real smoke client (openai) in that venv over loopback against the
  `vllm serve` stand-in (no GPU) that systemd runs: its JSON report, every check passed;
- MTP turned on (`vllm_service_speculative_tokens: 1`, VARS=) over that merged file, which has
  no nextn layer, is refused by scripts/gguf_nextn.py with its one line, in a real run and in
  `--check`, before the unit changes;
- a second converge changes nothing, and neither does `--check --diff`.

Then the controller on Python 3.12: `make setup` in a copy of this repository inside the same
container, and a controller command with the venv it made.

The container reaches no package registry by design (the suite's bridge has no route out): the
wheels come from a cache downloaded here by pip (tests/support/nspawn_wheels.py), bind-mounted
read-only, installed with --no-index. Stand-ins, named in the test names: `vllm serve` (the
venv's `vllm` entry point is replaced by tests/support/vllm_serve_standin.py) and the GPU.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import gguf_fixtures, nspawn_targets, nspawn_wheels
from support.deploy import REPO, Result, make
from support.llama_cpp import gguf_split_binary
from support.nspawn_targets import Node, Targets

pytestmark = pytest.mark.slow

HOST = "gpu05"
VENV = "/opt/glm5/venv"
SITE = f"{VENV}/lib/python3.12/site-packages"
SHARDS = "/srv/glm5/shards"
MERGED = "/srv/glm5/GLM-5-Q4_K_M.gguf"
HF_SOURCE = "/srv/glm5/hf-source"
REPORT = "/var/lib/glm5/smoke.json"
UNIT = "glm5-vllm.service"
STANDIN = REPO / "tests/support/vllm_serve_standin.py"
MANIFEST = REPO / "patches/vllm-0.23.0/MANIFEST"
CHECKOUT = "/root/glm5-sm120"
SWITCHES = {
    "preflight_gpu_required": False,  # no GPU in the container
    "preflight_disk_margin_gb": 0,  # the shards are a few KiB; the overlay's disk is the host's
    "nvidia_driver_enabled": False,  # test_deploy_nspawn.py runs these against the stand-in repo
    "cuda_toolkit_enabled": False,
    "gguf_weights_shard_dir": SHARDS,
    "gguf_weights_hf_source_dir": HF_SOURCE,  # no hub: the HF files come from the host
    "vllm_service_health_delay": 1,  # the stand-in answers in well under a second
    "vllm_service_health_retries": 30,
}
# The runtime role installs torch + CUDA wheels (9 GB) and checks their pins: the venv below takes
# its place with vLLM's own wheel and the tools' imports.
SKIP_TAGS = "runtime"
HF_FILES = {
    "config.json": {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"},
    "generation_config.json": {"eos_token_id": [154820], "temperature": 1.0},
    "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast"},
}


def manifest() -> dict[str, tuple[str, str]]:
    """MANIFEST's rows: path -> (sha256 before, sha256 after)."""
    rows = {}
    for line in MANIFEST.read_text().splitlines():
        if line and not line.startswith("#"):
            before, after, path = line.split()
            rows[path] = (before, after)
    return rows


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install_runtime_venv(node: Node, wheels: Path) -> None:
    """What the runtime role leaves, minus torch: a Python 3.12 venv with vLLM 0.23.0's wheel.

    --no-compile: byte-compiling vLLM's 600 MB adds half a minute and is not what is tested."""
    node.run("python3", "-m", "venv", VENV, check=True)
    pip = [f"{VENV}/bin/pip", "install", "-q", "--disable-pip-version-check", "--no-index",
           "--no-compile", "--find-links", f"{wheels}/runtime"]  # fmt: skip
    node.run(*pip, "--no-deps", nspawn_wheels.vllm_pin(), check=True, timeout=300)
    node.run(*pip, *nspawn_wheels.tool_pins(), check=True, timeout=300)
    # The stand-in takes the place of vLLM's `vllm` entry point: no GPU to serve on.
    entry = node.root / VENV.lstrip("/") / "bin/vllm"
    shutil.copy(STANDIN, entry)
    entry.chmod(0o755)


def write_model_inputs(node: Node, work: Path) -> tuple[list[Path], list, Path]:
    """Real split shards (gguf-py) in the target's shard dir, the HF files beside them, and
    llama-gguf-split's merge of the same shards here: (shards, tensors, reference merge)."""
    shard_dir = node.root / SHARDS.lstrip("/")
    shard_dir.mkdir(parents=True)
    tensors = gguf_fixtures.glm_dsa_tensors(seed=5)
    shards = gguf_fixtures.write_split(shard_dir, tensors, 3)
    hf = node.root / HF_SOURCE.lstrip("/")
    hf.mkdir(parents=True)
    for name, doc in HF_FILES.items():
        (hf / name).write_text(json.dumps(doc))
    reference = work / "llama-gguf-split-merged.gguf"
    subprocess.run(
        [gguf_split_binary(), "--merge", shards[0], reference],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return shards, tensors, reference


def deploy(inventory: Path, *, check: bool = False, vars_file: Path | None = None) -> Result:
    extra = {"CHECK": "1"} if check else {}
    if vars_file is not None:
        extra["VARS"] = str(vars_file)
    return make(
        "deploy", HOST=HOST, INVENTORY=str(inventory), ANSIBLE_ARGS=f"--skip-tags {SKIP_TAGS}",
        **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[Targets, Node, Path, tuple[subprocess.Popen, Path]]]:
    reason = nspawn_targets.host_requirements()
    if reason:
        pytest.skip(reason)
    wheels = nspawn_wheels.wheel_cache("3.12")
    setups: list[tuple[subprocess.Popen, Path]] = []
    with nspawn_targets.targets() as t, pytest.MonkeyPatch.context() as env:
        # make deploy's SSH masters under the suite's work dir, so teardown ends them.
        env.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(t.work / "cp"))
        try:
            node = t.add(HOST, distro="ubuntu2404", binds=(str(wheels),))
            install_runtime_venv(node, wheels)
            # `make setup` runs while the deploy does (their own venvs, their own files): the
            # controller proof then costs no wall time of its own.
            copy_checkout(node)
            env = ["env", "PIP_NO_INDEX=1", f"PIP_FIND_LINKS={wheels}/controller"]
            setup_log = t.work / "make-setup.log"
            setup = node.spawn(*env, "make", "-C", CHECKOUT, "--no-print-directory", "setup",
                               log=setup_log)  # fmt: skip
            setups.append((setup, setup_log))
            inv = t.work / "inventory"
            (inv / "group_vars").mkdir(parents=True)
            shutil.copy(REPO / "inventory/group_vars/all.yml", inv / "group_vars/all.yml")
            hosts = {HOST: {**node.ansible_vars(), **SWITCHES}}
            (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
            yield t, node, inv / "hosts.yml", setups[0]
        finally:
            for proc, _ in setups:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)
        left_after = t
    assert left_after.leftovers() == []


@pytest.fixture(scope="module")
def deployed(target) -> dict[str, object]:
    t, node, inventory, _ = target
    site = node.root / SITE.lstrip("/")
    pristine = {path: sha256(site / path) for path in manifest()}
    shards, tensors, reference = write_model_inputs(node, t.work)
    result = deploy(inventory)
    assert result.rc == 0, result.output[-6000:]
    return {"node": node, "inventory": inventory, "result": result, "pristine": pristine,
            "shards": shards, "tensors": tensors, "reference": reference}  # fmt: skip


def test_patch_role_turns_the_real_vllm_wheel_from_manifest_before_to_after(deployed) -> None:
    node, result = deployed["node"], deployed["result"]
    rows = manifest()
    # The wheel pip installed is vLLM 0.23.0 as released: every touched file at its "before".
    assert deployed["pristine"] == {path: before for path, (before, _) in rows.items()}
    site = node.root / SITE.lstrip("/")
    assert {path: sha256(site / path) for path in rows} == {p: a for p, (_, a) in rows.items()}
    assert "TASK [vllm_patches : Patches | Apply the series]" in result.output
    # The tool the role copied says so on the host, with the venv's own Python.
    tool = "/opt/glm5/src/scripts/vllm_patches.py"
    verify = node.run(f"{VENV}/bin/python", tool, "verify", "--json", "--site-packages", SITE)
    assert verify.returncode == 0, verify.stderr
    report = json.loads(verify.stdout)
    assert (report["ok"], report["state"], report["vllm_version"]) == (True, "patched", "0.23.0")
    files = {f["path"]: (f["state"], f["sha256"]) for f in report["files"]}
    assert files == {path: ("patched", after) for path, (_, after) in rows.items()}


def test_model_role_merges_real_split_shards_into_what_llama_gguf_split_makes(deployed) -> None:
    node = deployed["node"]
    merged = node.root / MERGED.lstrip("/")
    assert sha256(merged) == sha256(deployed["reference"])
    gguf_fixtures.assert_merged_matches(merged, deployed["shards"], deployed["tensors"], 32)
    stamp = json.loads((node.root / f"{MERGED}.stamp.json".lstrip("/")).read_text())
    assert [s["name"] for s in stamp["shards"]] == [p.name for p in deployed["shards"]]
    assert [s["size"] for s in stamp["shards"]] == [p.stat().st_size for p in deployed["shards"]]
    assert stamp["merged"]["size"] == merged.stat().st_size
    assert oct(merged.stat().st_mode & 0o777) == "0o644"
    # The HF files, config.json with the GGUF override, for the service user to read.
    hf = node.root / "srv/glm5/GLM-5-hf"
    config = json.loads((hf / "config.json").read_text())
    assert config == {**HF_FILES["config.json"], "indexer_rope_interleave": True}
    for name in ("generation_config.json", "tokenizer_config.json"):
        assert json.loads((hf / name).read_text()) == HF_FILES[name]
    # ... and the service reads them: the stand-in opened the merged file before it listened.
    pid = node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    cmdline = node.run("cat", f"/proc/{pid}/cmdline").stdout.split("\0")
    assert cmdline[1:4] == [f"{VENV}/bin/vllm", "serve", MERGED]


def test_smoke_role_runs_the_real_client_against_vllm_serve_standin(deployed) -> None:
    node, result = deployed["node"], deployed["result"]
    assert "TASK [vllm_smoke : Smoke | Run the smoke test against the endpoint]" in result.output
    path = node.root / REPORT.lstrip("/")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    report = json.loads(path.read_text())
    assert report["passed"] is True
    assert (report["base_url"], report["model"]) == ("http://127.0.0.1:8000/v1", "glm-5")
    statuses = {name: check["status"] for name, check in report["checks"].items()}
    # The service runs the tool-call and reasoning parsers by default: the role asks for their
    # checks too (a reply without a tool call passes, as with random weights).
    assert statuses == {name: "pass" for name in
                        ("models", "completion", "chat_completion", "chat_stream", "concurrency",
                         "auth", "tools", "tools_stream", "reasoning")}  # fmt: skip
    assert report["settings"]["api_key_set"] is True
    assert "stand-in reply" in report["checks"]["chat_stream"]["detail"]
    key = (node.root / "etc/glm5/api-key.env").read_text().strip().split("=", 1)[1]
    assert key not in path.read_text() and key not in result.output


def write_trunk_only_gguf(path: Path) -> None:
    """A glm-dsa GGUF header without the nextn layer, as a re-packed file may come."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, "glm-dsa")
    w.add_block_count(3)
    w.add_tensor("blk.2.attn_norm.weight", np.ones(16, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_mtp_is_checked_against_the_ggufs_nextn_layer_before_the_unit_changes(
    deployed, tmp_path: Path
) -> None:
    node, inventory = deployed["node"], deployed["inventory"]
    unit = node.root / f"etc/systemd/system/{UNIT}"
    before = unit.read_bytes()
    pid = node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    task = "TASK [vllm_service : Service | Refuse MTP speculative decoding without the GGUF's nextn"
    # The merged fixture has its nextn block: --check passes the header read and shows the
    # flag the unit would get.
    on = tmp_path / "mtp.yml"
    on.write_text("vllm_service_speculative_tokens: 1\n")
    res = deploy(inventory, check=True, vars_file=on)
    assert res.rc == 0, res.output[-4000:]
    added = '+    --speculative-config \'{"method": "mtp", "num_speculative_tokens": 1, '
    assert task in res.output and added in res.output, res.output[-4000:]
    # A file without it: refused with gguf_nextn's line, in a real run and in --check alike.
    trunk_only = "/srv/glm5/trunk-only.gguf"
    write_trunk_only_gguf(node.root / trunk_only.lstrip("/"))
    off = tmp_path / "mtp-trunk-only.yml"
    off.write_text(f"vllm_service_speculative_tokens: 1\nvllm_service_model_path: {trunk_only}\n")
    line = f"error: {trunk_only} has no complete MTP/nextn layer (glm-dsa.nextn_predict_layers=0"
    for check in (False, True):
        res = deploy(inventory, check=check, vars_file=off)
        assert res.rc != 0, res.output[-4000:]
        assert task in res.output and line in res.output, res.output[-4000:]
        assert res.recap(HOST)["failed"] == 1, res.output[-4000:]
    (node.root / trunk_only.lstrip("/")).unlink()
    assert unit.read_bytes() == before and b"--speculative-config" not in before
    assert node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip() == pid


def test_second_converge_and_check_diff_change_nothing(deployed) -> None:
    node, inventory = deployed["node"], deployed["inventory"]
    merged = node.root / MERGED.lstrip("/")
    before = merged.stat().st_mtime_ns
    pid = node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip()
    again = deploy(inventory)
    assert again.rc == 0, again.output[-4000:]
    assert again.recap(HOST)["changed"] == 0, again.output[-4000:]
    check = deploy(inventory, check=True)
    assert check.rc == 0, check.output[-4000:]
    assert check.recap(HOST)["changed"] == 0, check.output[-4000:]
    assert merged.stat().st_mtime_ns == before  # not merged again
    assert node.run("systemctl", "show", "-p", "MainPID", "--value", UNIT).stdout.strip() == pid


def copy_checkout(node: Node) -> Path:
    """This checkout's files (tracked and untracked, not ignored) into the target, as a clone."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    dest = node.root / CHECKOUT.lstrip("/")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def test_make_setup_builds_the_controller_on_ubuntu2404_python312(target, deployed) -> None:
    _, node, _, (setup, setup_log) = target
    rc = setup.wait(timeout=600)
    out = setup_log.read_text(errors="replace")
    assert rc == 0, out[-4000:]
    assert "controller env ready: .venv (Python 3.12." in out
    py = node.run(f"{CHECKOUT}/.venv/bin/python", "-c", "import sys; print(sys.version_info[:2])")
    assert py.stdout == "(3, 12)\n"
    # The lock installed exactly: pip sees every pin of requirements/controller.txt.
    freeze = node.run(f"{CHECKOUT}/.venv/bin/pip", "freeze", "--disable-pip-version-check").stdout
    locked = {line.lower().replace("_", "-") for line in
              (REPO / "requirements/controller.txt").read_text().splitlines()
              if line and not line.startswith("#")}  # fmt: skip
    assert locked <= {line.lower().replace("_", "-") for line in freeze.splitlines()}
    # A controller command on 3.12: the HOST= resolver's tests, ansible-core's inventory on 3.12.
    unit = "tests/unit/test_ansible_targets.py"
    collected = subprocess.run(
        [REPO / ".venv/bin/pytest", "--collect-only", "-q", "-p", "no:cacheprovider", unit],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    count = sum(1 for line in collected.splitlines() if line.startswith(unit))
    assert count >= 8
    argv = f"cd {CHECKOUT} && .venv/bin/pytest -q -p no:cacheprovider {unit}"
    ran = node.run("bash", "-c", argv, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert re.search(rf"^{count} passed in ", ran.stdout, re.M), ran.stdout[-2000:]
