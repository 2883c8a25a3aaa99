"""tests/e2e/route_check.py against a real loopback HTTP server (tests/support/route_server.py).

The checker is what the pipeline's `routes` step runs on the H200 against the real vLLM server;
here a guarded server passes and each way of leaving a route open fails, naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.route_server import ROUTES, RouteServer

from e2e import route_check

KEY = "e2e-0123456789abcdef"
EXPECTED = list(dict.fromkeys(ROUTES + route_check.UNLISTED))


def run(tmp_path: Path, server: RouteServer, *extra: str) -> tuple[int, dict | None]:
    keyfile = tmp_path / "api_key"
    keyfile.write_text(KEY + "\n")
    out = tmp_path / "routes.json"
    rc = route_check.main(
        ["--base-url", server.base_url, "--api-key-file", str(keyfile), "--json", str(out),
         "--timeout", "5", "--deadline", "60", *extra]
    )  # fmt: skip
    return rc, json.loads(out.read_text()) if out.exists() else None


def test_guarded_server_passes_and_every_route_is_tried(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY) as server:
        rc, report = run(tmp_path, server)
    assert rc == 0, capsys.readouterr().err
    assert report is not None and report["passed"] is True and report["open"] == []
    assert [(r["method"], r["path"]) for r in report["results"]] == EXPECTED
    assert report["routes_listed"] == len(ROUTES)
    assert report["requests"] == 2 + 2 * len(EXPECTED)
    by_route = {(r["method"], r["path"]): r for r in report["results"]}
    assert by_route[("POST", "/invocations")] | {} == {
        "method": "POST", "path": "/invocations", "sent": "/invocations", "no_key": 401,
        "wrong_key": 401, "expect": 401, "ok": True, "listed": True,
    }  # fmt: skip
    assert by_route[("GET", "/v1/models/{model_id}")]["sent"] == "/v1/models/route-check"
    assert by_route[("GET", "/health")]["no_key"] == 200
    assert by_route[("GET", "/metrics")]["listed"] is False
    # What went over the wire: the key only to /openapi.json and /v1/models, never elsewhere.
    keyed = [(m, p) for m, p, a in server.requests if a == f"Bearer {KEY}"]
    assert keyed == [("GET", "/openapi.json"), ("GET", "/v1/models")]
    assert sum(1 for *_, a in server.requests if a is None) == len(EXPECTED)
    assert KEY not in (tmp_path / "routes.json").read_text()
    out = capsys.readouterr().out
    assert f"routes: {len(EXPECTED)} checked ({len(ROUTES)} listed" in out


def test_one_open_route_fails_naming_it(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY, open_routes={("POST", "/invocations")}) as server:
        rc, report = run(tmp_path, server)
    err = capsys.readouterr().err
    assert rc == 1
    assert err == "error: open route: POST /invocations answered 200 without a key (want 401)\n"
    assert report is not None and report["passed"] is False
    assert report["open"] == ["POST /invocations"]
    assert len(report["results"]) == len(EXPECTED)  # the check went on after the first


def test_first_of_two_open_routes_is_named_and_both_are_listed(tmp_path: Path, capsys) -> None:
    opened = {("POST", "/tokenize"), ("GET", "/metrics")}
    with RouteServer(KEY, open_routes=opened) as server:
        rc, report = run(tmp_path, server)
    assert rc == 1
    assert capsys.readouterr().err.startswith("error: open route: POST /tokenize answered 200")
    assert report is not None and report["open"] == ["POST /tokenize", "GET /metrics"]


def test_any_bearer_key_accepted_is_an_open_route(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY, accept_any_key=True) as server:
        rc, report = run(tmp_path, server)
    assert rc == 1
    err = capsys.readouterr().err
    assert err == "error: open route: GET /v1/models answered 200 with a wrong key (want 401)\n"
    assert report is not None and "GET /v1/models" in report["open"]


def test_guarded_health_fails(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY, guard_probes=True) as server:
        rc, report = run(tmp_path, server)
    assert rc == 1
    err = capsys.readouterr().err
    assert err == ("error: GET /health answered 401 without a key; it must stay open (200)\n")
    assert report is not None and report["open"] == []


def test_schema_not_served_is_one_error_line(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY, schema_status=500) as server:
        rc, report = run(tmp_path, server)
    assert rc == 1
    assert capsys.readouterr().err == (
        "error: GET /openapi.json with the key answered 500, not 200\n"
    )
    assert report is not None and report["passed"] is False and "error" in report


def test_too_many_routes_refused_before_probing(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY) as server:
        rc, _ = run(tmp_path, server, "--max-routes", "3")
        sent = len(server.requests)
    assert rc == 1
    assert capsys.readouterr().err == (f"error: {len(EXPECTED)} routes exceed --max-routes 3\n")
    assert sent == 1  # only the schema was fetched


def test_no_server_is_one_error_line(tmp_path: Path, capsys) -> None:
    with RouteServer(KEY) as server:
        url = server.base_url  # the port is free again after the server stops
    keyfile = tmp_path / "k"
    keyfile.write_text(KEY)
    rc = route_check.main(["--base-url", url, "--api-key-file", str(keyfile)])
    err = capsys.readouterr().err
    assert rc == 1
    assert (
        err.startswith("error: GET /openapi.json: ConnectionRefusedError") and err.count("\n") == 1
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://192.0.2.1:8000", "error: 192.0.2.1 is not a loopback address\n"),
        ("https://127.0.0.1:8000", "error: --base-url must be http://HOST:PORT, got "
                                   "'https://127.0.0.1:8000'\n"),
        ("http://127.0.0.1:8000/v1", "error: --base-url must be http://HOST:PORT, got "
                                     "'http://127.0.0.1:8000/v1'\n"),
    ],
)  # fmt: skip
def test_non_loopback_or_bad_url_refused(tmp_path: Path, capsys, url: str, message: str) -> None:
    keyfile = tmp_path / "k"
    keyfile.write_text(KEY)
    assert route_check.main(["--base-url", url, "--api-key-file", str(keyfile)]) == 2
    assert capsys.readouterr().err == message


def test_empty_key_file_refused(tmp_path: Path, capsys) -> None:
    keyfile = tmp_path / "k"
    keyfile.write_text("\n")
    assert (
        route_check.main(["--base-url", "http://127.0.0.1:1", "--api-key-file", str(keyfile)]) == 2
    )
    assert capsys.readouterr().err == f"error: {keyfile} is empty\n"


@pytest.mark.parametrize(
    "base_url",
    [
        "http://10.0.0.1:8000",
        "https://127.0.0.1:8000",
        "http://127.0.0.1",
        "http://192.0.2.1:80",
    ],
)
def test_the_checks_refuse_a_base_url_off_loopback_in_one_line(base_url: str, capsys) -> None:
    assert route_check.loopback_url(base_url) is None
    err = capsys.readouterr().err
    assert err == f"error: --base-url must be http://LOOPBACK:PORT, got {base_url!r}\n"


def test_the_checks_take_a_loopback_base_url() -> None:
    url = route_check.loopback_url("http://127.0.0.1:8123/v1")
    assert url is not None and (url.hostname, url.port) == ("127.0.0.1", 8123)
