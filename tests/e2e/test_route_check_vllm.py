"""tests/e2e/route_check.py against vLLM 0.23.0's real app served over loopback HTTP.

The same checker the pipeline's `routes` step runs on the H200, here against the real app with
no engine (tests/support/vllm_app_server.py, uvicorn on 127.0.0.1): pristine vLLM fails naming
its first open route (vllm#58144), the copy patched by the real series (patch 0006) passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.patched_vllm import patched_site

from e2e import route_check

pytestmark = pytest.mark.runtime
TESTS = Path(__file__).resolve().parents[1]
KEY = "sk-route-check-key"


def check(tmp_path: Path, pythonpath: Path | None, capsys) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "WARNING"}
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(pythonpath)] if pythonpath else []), str(TESTS), str(TESTS.parent / "scripts")]
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "support.vllm_app_server", KEY],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "port N" once it listens; "" if it died
        assert line.startswith("port "), f"app server did not start: {line!r}"
        (tmp_path / "key").write_text(KEY)
        out = tmp_path / "routes.json"
        rc = route_check.main(
            ["--base-url", f"http://127.0.0.1:{line.split()[1]}", "--api-key-file",
             str(tmp_path / "key"), "--json", str(out), "--deadline", "120"]
        )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rc, json.loads(out.read_text()), capsys.readouterr().err


def test_pristine_vllm_fails_naming_its_first_open_route(tmp_path: Path, capsys) -> None:
    rc, report, err = check(tmp_path, None, capsys)
    assert rc == 1
    first = report["open"][0]
    assert err.startswith(f"error: open route: {first} answered ") and err.endswith("(want 401)\n")
    for route in ("POST /invocations", "POST /tokenize", "GET /metrics", "GET /openapi.json"):
        assert route in report["open"]
    assert "GET /v1/models" not in report["open"]  # /v1 is one of the three guarded prefixes


def test_patched_vllm_guards_every_route(tmp_path: Path, capsys) -> None:
    site = patched_site(tmp_path / "site")
    rc, report, err = check(tmp_path, site, capsys)
    assert rc == 0, err
    assert report["passed"] is True and report["open"] == []
    assert report["v1_models_with_key"] == 500  # past the guard; no engine to list models
    by_route = {f"{r['method']} {r['path']}": r for r in report["results"]}
    assert by_route["POST /invocations"]["no_key"] == 401
    assert by_route["GET /health"]["no_key"] == 200 and by_route["POST /ping"]["no_key"] == 200
    assert report["routes_listed"] >= 20 and report["routes_checked"] > report["routes_listed"]
