"""CPU checks of the end-to-end GPU pipeline scripts: syntax, step order, dry-run, staging I/O.

The GPU run itself happens on the H200 test machine (tests/e2e/README.md); these tests make sure
the command sequence parses, lists every step in order, writes nothing in --dry-run, and that the
device-side staging script reassembles a chunked payload and installs its wheels.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PIPELINE = HERE / "pipeline.sh"
DEVICE_STAGE = HERE / "device_stage.sh"
STEPS = [
    "ckpt", "convert", "merge", "repro", "patch", "serve", "health", "routes", "smoke", "backends",
    "stop",
]  # fmt: skip


def run(args: list[str], env: dict[str, str] | None = None, cwd: Path = REPO):
    return subprocess.run(
        args, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("script", ["pipeline.sh", "stage_local.sh", "device_stage.sh"])
def test_bash_syntax(script: str) -> None:
    r = run(["bash", "-n", str(HERE / script)])
    assert r.returncode == 0, r.stderr


def dry_run(tmp_path: Path, *steps: str):
    env = {"WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "PY": "python3"}
    return run(["bash", str(PIPELINE), "--dry-run", *steps], env=env)


def test_dry_run_all_lists_every_step_in_order_and_writes_nothing(tmp_path: Path) -> None:
    r = dry_run(tmp_path, "all")
    assert r.returncode == 0, r.stderr
    order = [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("== step ")]
    assert order == STEPS
    assert "done: exit 0" in r.stdout
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "out").exists()


def test_dry_run_shows_the_fixed_interfaces(tmp_path: Path) -> None:
    out = dry_run(tmp_path, "all").stdout
    work = tmp_path / "work"
    merged = f"{work}/tiny-glm5-Q8_0.gguf"
    assert f"-m support.tiny_glm5 --out {work}/ckpt --seed 0 --serve" in out
    assert f"-m support.llama_cpp convert --llama-cpp {work}/llama_cpp -- {work}/ckpt" in out
    assert "--outtype q8_0" in out and "--split-max-tensors 20" in out
    assert f"scripts/gguf_merge.py --no-progress {work}/gguf/tiny-glm5-Q8_0-00001-of-" in out
    assert f"-m e2e.repro_failures --gguf {merged} --hf-dir {work}/ckpt" in out
    assert "scripts/vllm_patches.py apply --site-packages /tmp/site" in out
    assert "scripts/vllm_patches.py verify --site-packages /tmp/site" in out
    assert "--target /tmp/site ./backend" in out
    serve = next(line for line in out.splitlines() if line.startswith("+ setsid"))
    for flag in (
        f"serve {merged} --hf-config-path {work}/ckpt --tokenizer {work}/ckpt",
        "--dtype float16",
        "--attention-backend CUSTOM",
        '--additional-config \\{\\"sparse_mla_indexer\\":\\ \\"auto\\"\\}',
        "--api-key KEY",
        "--host 127.0.0.1",
    ):
        assert flag in serve
    assert "--enforce-eager" not in serve  # CUDA graphs stay on
    smoke = next(line for line in out.splitlines() if "scripts/smoke_test.py" in line)
    assert "--base-url http://127.0.0.1:8000/v1 --api-key KEY" in smoke
    assert f"--json {tmp_path}/out/smoke.json" in smoke
    assert "scripts/probe_backends.py --capability 12.0 --dtype float16" in out
    routes = next(line for line in out.splitlines() if "-m e2e.route_check" in line)
    assert f"--base-url http://127.0.0.1:8000 --api-key-file {work}/api_key" in routes
    assert f"--json {tmp_path}/out/routes.json" in routes


def test_dry_run_of_chosen_steps_keeps_their_order(tmp_path: Path) -> None:
    r = dry_run(tmp_path, "serve", "health", "smoke", "stop")
    assert r.returncode == 0, r.stderr
    order = [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("== step ")]
    assert order == ["serve", "health", "smoke", "stop"]


@pytest.mark.parametrize("args", [[], ["bogus"], ["--dry-run", "all", "nope"]])
def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    r = run(["bash", str(PIPELINE), *args], env={"WORK": str(tmp_path / "w")})
    assert r.returncode == 2
    assert r.stderr.startswith("error: ")
    assert not (tmp_path / "w").exists()


def make_wheel(path: Path, name: str, version: str) -> None:
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr(f"{dist}/RECORD", record)


def test_device_stage_reassembles_chunks_and_installs(tmp_path: Path) -> None:
    """Real pip, real tar and sha256sum on a small payload split as stage_local.sh splits it."""
    pay = tmp_path / "pay" / "wheels"
    (pay / "smoke").mkdir(parents=True)
    make_wheel(pay / "e2e_dep-1.0-py3-none-any.whl", "e2e_dep", "1.0")
    make_wheel(pay / "smoke" / "e2e_client-2.0-py3-none-any.whl", "e2e_client", "2.0")
    llama = io.BytesIO()
    with tarfile.open(fileobj=llama, mode="w:gz") as t:
        data = b"print('converter')\n"
        info = tarfile.TarInfo("convert_hf_to_gguf.py")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    (pay / "llama_cpp.tgz").write_bytes(llama.getvalue())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(pay, arcname="wheels")
    payload = buf.getvalue()
    repo = tmp_path / "repo"
    half = len(payload) // 2 + 1
    for i, part in enumerate((payload[:half], payload[half:])):
        c = repo / ".vllmstage" / "stage" / f"c{i + 1}"
        c.mkdir(parents=True)
        (c / f"part.{i}").write_bytes(part)
        (c / "chunks.count").write_text("2\n")
    digest = hashlib.sha256(payload).hexdigest()
    (repo / ".vllmstage/stage/c2/payload.sha256").write_text(f"{digest}  payload.tar\n")
    env = {
        "WORK": str(tmp_path / "e2e"),
        "SITE": str(tmp_path / "site"),
        "SMOKE_SITE": str(tmp_path / "smoke-site"),
        "PY": sys.executable,
    }
    r = run(["bash", str(DEVICE_STAGE), "install"], env=env, cwd=repo)
    assert r.returncode == 1 and "error: payload.sha256 missing" in r.stderr
    for n in ("1", "2"):
        r = run(["bash", str(DEVICE_STAGE), "recv", n], env=env, cwd=repo)
        assert r.returncode == 0, r.stderr
    r = run(["bash", str(DEVICE_STAGE), "install"], env=env, cwd=repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "STAGE reassemble+untar" in r.stdout
    assert (tmp_path / "site/e2e_dep/__init__.py").read_text() == "VERSION = '1.0'\n"
    assert (tmp_path / "smoke-site/e2e_client/__init__.py").is_file()
    assert not (tmp_path / "site/e2e_client").exists()
    assert (tmp_path / "e2e/llama_cpp/convert_hf_to_gguf.py").read_bytes() == data
    assert (tmp_path / "e2e/STAGED").is_file()
    # a repeated last call on the warm machine: recv again, install says it is done
    assert run(["bash", str(DEVICE_STAGE), "recv", "2"], env=env, cwd=repo).returncode == 0
    r = run(["bash", str(DEVICE_STAGE), "install"], env=env, cwd=repo)
    assert r.returncode == 0 and "STAGE already installed" in r.stdout


def test_device_stage_usage(tmp_path: Path) -> None:
    r = run(["bash", str(DEVICE_STAGE)], cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: usage")
    r = run(["bash", str(DEVICE_STAGE), "recv", "3"], cwd=tmp_path)
    assert r.returncode == 1 and "error: .vllmstage/stage/c3 not carried" in r.stderr


def test_report_summarises_steps_failures_and_smoke(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "logs").mkdir(parents=True)
    out.mkdir()
    (work / "steps.tsv").write_text(
        "# invocation 100: ckpt convert\nckpt\tok\t12.5\nconvert\tfailed\t3.0\n"
        "# invocation 200: convert\nconvert\tok\t20.0\n"
    )
    case = {"name": "backend", "as_expected": True, "error_type": "ValueError"}
    case["message"] = "No valid attention backend found for cuda"
    (out / "failures.json").write_text(json.dumps({"cases": [case]}))
    (out / "smoke.json").write_text(json.dumps({"ok": True}))
    routes = {"passed": False, "routes_checked": 60, "open": ["POST /invocations"], "results": []}
    (out / "routes.json").write_text(json.dumps(routes))
    (work / "logs" / "health.log").write_text("healthy 61 s after launch\n")
    r = run([sys.executable, str(HERE / "e2e_report.py"), "--work", str(work), "--out", str(out)])
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [i["seconds"] for i in summary["invocations"]] == [15.5, 20.0]
    assert summary["latest"] == {
        "ckpt": {"status": "ok", "seconds": 12.5},
        "convert": {"status": "ok", "seconds": 20.0},
    }
    assert summary["smoke"] == {"ok": True}
    assert summary["routes"] == {
        "passed": False,
        "routes_checked": 60,
        "open": ["POST /invocations"],
    }
    assert 'routes: {"passed": false, "routes_checked": 60' in r.stdout
    assert summary["server_highlights"] == ["healthy 61 s after launch"]
    assert "repro ok  backend: ValueError: No valid attention backend found" in r.stdout


def test_report_keeps_the_api_key_out_of_the_summary(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "logs").mkdir(parents=True)
    (work / "api_key").write_text("e2e-0123456789abcdef01234567\n")
    (work / "logs" / "health.log").write_text(
        "non-default args: {'api_key': ['e2e-0123456789abcdef01234567'], 'port': 8000}\n"
    )
    r = run([sys.executable, str(HERE / "e2e_report.py"), "--work", str(work), "--out", str(out)])
    assert r.returncode == 0, r.stderr
    text = (out / "summary.json").read_text()
    assert "e2e-0123456789abcdef01234567" not in text
    assert json.loads(text)["server_highlights"] == [
        "non-default args: {'api_key': ['<api-key>'], 'port': 8000}"
    ]


def test_convert_wrapper_needs_converter_arguments(tmp_path: Path) -> None:
    convert = [sys.executable, "-m", "support.llama_cpp", "convert", "--llama-cpp", str(tmp_path)]
    tests_path = {"PYTHONPATH": str(REPO / "tests")}
    r = run(convert, env=tests_path)
    assert r.returncode == 2
    assert "error:" in r.stderr and "convert_hf_to_gguf.py not found" in r.stderr
    if shutil.which("bash"):
        (tmp_path / "convert_hf_to_gguf.py").write_text("")
        r = run(convert, env=tests_path)
        assert r.returncode == 2 and "give the converter's arguments after --" in r.stderr


def test_dry_run_of_the_glm52_and_tools_steps(tmp_path: Path) -> None:
    env = {"WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "PY": "python3",
           "GENERATION": "5.2", "TOPK_DUMP": "301", "CHAT_TEMPLATE": "glm47"}  # fmt: skip
    steps = ["ckpt", "serve", "health", "indexshare", "tools", "stop"]
    r = run(["bash", str(PIPELINE), "--dry-run", *steps], env=env)
    assert r.returncode == 0, r.stderr
    order = [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("== step ")]
    assert order == steps
    work = tmp_path / "work"
    assert f"--out {work}/ckpt --seed 0 --serve --generation 5.2 --layers 7" in r.stdout
    serve = next(line for line in r.stdout.splitlines() if line.startswith("+ setsid"))
    assert serve.startswith(f"+ setsid env VLLM_SPARSE_MLA_DUMP_TOPK={work}/topk:301 python3 -m")
    assert f"-m support.glm5_chat {work}/ckpt --template {REPO}/tests/support/" in r.stdout
    assert f"--dump-dir {work}/topk --tokens 301 --json {tmp_path}/out/index_share.json" in r.stdout
    assert f"-m e2e.tool_check --base-url http://127.0.0.1:8000 --api-key-file {work}/api_key" in (
        r.stdout
    )
    assert "all" not in order and "indexshare" not in dry_run(tmp_path, "all").stdout


def test_indexshare_without_topk_dump_fails(tmp_path: Path) -> None:
    env = {"WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "PY": "python3"}
    r = run(["bash", str(PIPELINE), "--dry-run", "indexshare"], env=env)
    assert r.returncode == 1
    assert "error: indexshare needs TOPK_DUMP=N (set for serve too)" in r.stdout


def test_dry_run_of_the_reference_step(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    env = {"WORK": str(work), "OUT": str(out), "PY": "python3", "GENERATION": "5.2",
           "TOPK_DUMP": "301"}  # fmt: skip
    steps = ["indexshare", "reference", "stop"]
    r = run(["bash", str(PIPELINE), "--dry-run", *steps], env=env)
    assert r.returncode == 0, r.stderr
    order = [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("== step ")]
    assert order == steps
    ref = next(line for line in r.stdout.splitlines() if "-m e2e.reference_check" in line)
    assert ref == (
        "+ env PYTHONPATH=tests:/tmp/site python3 -m e2e.reference_check"
        f" --capture {out}/capture.json --gguf {work}/tiny-glm5-Q8_0.gguf --hf-dir {work}/ckpt"
        f" --topk {out}/topk.pt --json {out}/reference.json >> {work}/logs/reference.log"
    )
    r = run(["bash", str(PIPELINE), "--dry-run", "reference"],
            env=env | {"REFERENCE_SPREAD": "/tmp/flashmla.json"})  # fmt: skip
    assert "--json " + f"{out}/reference.json --spread-capture /tmp/flashmla.json >>" in r.stdout
    all_steps = dry_run(tmp_path, "all").stdout
    assert "== step reference" not in all_steps and "reference_check" not in all_steps
    usage = run(["bash", str(PIPELINE), "--help"]).stdout
    assert "reference   tests/e2e/reference_check.py, after indexshare" in usage
