"""Patch 0006 on vLLM 0.23.0's real server app: every route needs the API key but /health, /ping.

tests/support/vllm_auth_probe.py builds the app the way `vllm serve --api-key KEY` does and sends
every registered route through it, once with the pristine installed vLLM (the bug, vllm#58144)
and once with a copy patched by the real series (tests/support/patched_vllm.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.patched_vllm import child_env, patched_site

pytestmark = pytest.mark.runtime
TESTS = Path(__file__).resolve().parents[1]
KEY = "sk-auth-probe-key"
OPEN = {"GET /health", "GET /ping", "POST /ping"}
# The routes vllm#58144 names, and what each one does when it is open.
EXPOSED = [
    "POST /invocations",  # full chat and completions
    "POST /generative_scoring",  # runs the model
    "POST /tokenize",
    "POST /detokenize",
    "GET /metrics",
    "POST /scale_elastic_ep",
    "GET /docs",
    "GET /openapi.json",
]
UNAUTHORIZED = [401, '{"error":"Unauthorized"}']


def probe(pythonpath: Path | None) -> dict[str, Any]:
    env = child_env(pythonpath, TESTS, TESTS.parent / "scripts")
    res = subprocess.run(
        [sys.executable, "-m", "support.vllm_auth_probe", KEY],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def pristine() -> dict[str, Any]:
    return probe(None)


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    site = patched_site(tmp_path_factory.mktemp("auth") / "site")
    data = probe(site)
    assert data["vllm_file"] == str(site / "vllm" / "__init__.py")
    return data


def test_pristine_vllm_leaves_the_listed_routes_open(pristine: dict[str, Any]) -> None:
    results = pristine["results"]
    assert "site-packages/vllm/" in pristine["vllm_file"]
    for route in EXPOSED:
        assert results[route]["none"][0] != 401, route  # answered without any key
    assert results["GET /v1/models"]["none"] == UNAUTHORIZED  # only the prefixes are guarded


def test_patched_every_route_refuses_a_missing_or_wrong_key(patched: dict[str, Any]) -> None:
    routes = {f"{m} {p}" for m, p in patched["routes"]}
    assert set(EXPOSED) | OPEN <= routes
    assert len(routes) >= 25  # the whole route table was probed, not a hand-picked few
    for route in sorted(routes - OPEN):
        result = patched["results"][route]
        assert result["none"] == UNAUTHORIZED, route
        assert result["wrong"] == UNAUTHORIZED, route


def test_patched_the_key_passes_through_to_the_route(patched: dict[str, Any]) -> None:
    results = patched["results"]
    for route in sorted({f"{m} {p}" for m, p in patched["routes"]}):
        assert results[route]["key"][0] != 401, route
    assert results["GET /metrics"]["key"][0] == 200
    assert results["GET /metrics"]["key"][1].startswith("# HELP ")  # Prometheus text
    assert results["GET /openapi.json"]["key"][0] == 200
    assert results["GET /openapi.json"]["key"][1].startswith('{"openapi":')


@pytest.mark.parametrize("route", sorted(OPEN))
def test_patched_health_and_ping_stay_open(patched: dict[str, Any], route: str) -> None:
    result = patched["results"][route]
    assert result["none"] == [200, ""]
    assert result["wrong"] == [200, ""]


@pytest.mark.parametrize(
    "route",
    [
        "GET /health/",
        "GET //health",
        "GET /HEALTH",
        "GET /healthz",
        "GET /ping/x",
        "GET /no-such-route",
        "OPTIONS /v1/models",
    ],
)
def test_patched_only_the_exact_open_paths_skip_the_key(
    patched: dict[str, Any], route: str
) -> None:
    assert patched["results"][route]["none"] == UNAUTHORIZED
    assert patched["results"][route]["key"][0] != 401


def test_patched_cors_preflight_still_answered(patched: dict[str, Any]) -> None:
    status, body = patched["results"]["PREFLIGHT /v1/chat/completions"]["none"]
    assert status == 200
    assert body == "OK"  # Starlette's CORSMiddleware answers it, not the route
