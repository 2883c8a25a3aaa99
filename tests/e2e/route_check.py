"""Every route of a running vLLM server needs the API key, except /health and /ping (issue 16).

The end-to-end pipeline's `routes` step (tests/e2e/pipeline.sh) runs it against the real server
on the GPU machine, after `health`:

    PYTHONPATH=tests:scripts python3 -m e2e.route_check --base-url http://127.0.0.1:8000 \\
        --api-key-file /tmp/e2e/api_key --json OUT/routes.json

It lists the app's own routes (GET /openapi.json WITH the key, so the list is the server's, not
a copy), adds the routes FastAPI and vLLM mount outside the schema (/openapi.json, /docs, /redoc,
/metrics, ...), then sends every method of every route twice, with no key and with a wrong key,
and expects 401 both times; /health and /ping must answer 200 without a key (what load
balancers probe). Path parameters are filled with a placeholder, and POST/PUT/PATCH bodies are
`{}`: a guarded route refuses before the handler runs, so the body never matters; an open one
shows up by any status other than 401. Requests with the right key go only to /openapi.json and
GET /v1/models (proof that the key gets past the guard, so the 401s are the guard's answer to
the missing key and not to every request).

Only loopback addresses are contacted (the server the pipeline started on this machine); the
run is bounded: at most --max-routes routes, --timeout per request, --deadline for the whole
check, response bodies read up to a cap. The key is never printed or written.

Exit: 0 every route is guarded and /health, /ping are open; 1 an open route (the error line names
the first one), a guarded /health or /ping, or the routes could not be listed; 2 usage (bad
arguments, a non-loopback address).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import re
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safe_files
from support import cli

EXAMPLES = """examples:
  python3 -m e2e.route_check --base-url http://127.0.0.1:8000 --api-key-file /tmp/e2e/api_key
  python3 -m e2e.route_check --base-url http://127.0.0.1:8000 --api-key-file KEYFILE \\
      --json routes.json --timeout 5 --deadline 120
"""
OPEN = {"/health", "/ping"}  # vLLM's probes; every other route needs the key
# Served by FastAPI or mounted by vLLM outside the OpenAPI schema (include_in_schema=False or a
# mounted sub-app), so /openapi.json never lists them.
UNLISTED = [
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/metrics"),
    ("GET", "/metrics/"),
    ("GET", "/health"),
    ("GET", "/ping"),
    ("POST", "/ping"),
]
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
BODY_CAP = 64 * 1024
SCHEMA_CAP = 8 * 1024 * 1024
PLACEHOLDER = "route-check"


class CheckError(Exception):
    """A failure of the check itself (no schema, no connection): one error line, exit 1."""


@dataclass
class Client:
    host: str
    port: int
    timeout: float
    deadline: float  # time.monotonic() past which no request starts

    def request(
        self,
        method: str,
        path: str,
        key: str | None,
        cap: int = BODY_CAP,
        payload: bytes = b"{}",
    ) -> tuple[int, bytes]:
        """One request (POST/PUT/PATCH send `payload` as JSON): (status, body up to cap)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CheckError("the check ran past its --deadline")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=min(self.timeout, left))
        headers = {"Connection": "close"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        body = None
        if method in ("POST", "PUT", "PATCH"):
            body = payload
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read(cap)
            return resp.status, data
        except (OSError, http.client.HTTPException) as exc:
            raise CheckError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def post_json(self, path: str, key: str, obj: Any) -> tuple[int, bytes]:
        return self.request("POST", path, key, SCHEMA_CAP, json.dumps(obj).encode())


def loopback(host: str) -> bool:
    """True for localhost and 127.0.0.0/8 or ::1, after resolving the name."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def loopback_url(base_url: str) -> urllib.parse.SplitResult | None:
    """The e2e checks' --base-url split, or None after one error line: http://LOOPBACK:PORT only."""
    url = urllib.parse.urlsplit(base_url)
    if url.scheme == "http" and url.hostname and url.port and loopback(url.hostname):
        return url
    print(f"error: --base-url must be http://LOOPBACK:PORT, got {base_url!r}", file=sys.stderr)
    return None


def fill(path: str) -> str:
    """/v1/models/{model_id} -> /v1/models/route-check (any parameter, any converter)."""
    return re.sub(r"\{[^}/]+\}", PLACEHOLDER, path)


def schema_routes(schema: Any) -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in an OpenAPI document, in its order."""
    if not isinstance(schema, dict) or not isinstance(schema.get("paths"), dict):
        raise CheckError("/openapi.json has no 'paths' object")
    routes = []
    for path, ops in schema["paths"].items():
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(ops, dict):
            raise CheckError(f"/openapi.json: malformed path entry {str(path)[:80]!r}")
        routes += [(m.upper(), path) for m in ops if m.upper() in METHODS]
    return routes


def check(client: Client, key: str, max_routes: int) -> dict[str, Any]:
    status, body = client.request("GET", "/openapi.json", key, cap=SCHEMA_CAP)
    if status != 200:
        raise CheckError(f"GET /openapi.json with the key answered {status}, not 200")
    try:
        listed = schema_routes(json.loads(body))
    except ValueError as exc:
        raise CheckError(f"/openapi.json is not JSON: {exc}") from exc
    routes = list(dict.fromkeys(listed + UNLISTED))
    if len(routes) > max_routes:
        raise CheckError(f"{len(routes)} routes exceed --max-routes {max_routes}")
    key_ok, _ = client.request("GET", "/v1/models", key)
    results = []
    failures = []
    for method, path in routes:
        url = fill(path)
        none, _ = client.request(method, url, None)
        wrong, _ = client.request(method, url, "wrong-" + key[::-1])
        expect = 200 if path in OPEN else 401
        ok = none == expect and (path in OPEN or wrong == 401)
        entry = {"method": method, "path": path, "sent": url, "no_key": none, "wrong_key": wrong}
        entry |= {"expect": expect, "ok": ok, "listed": (method, path) in listed}
        results.append(entry)
        if not ok:
            failures.append(entry)
    return {
        "routes_listed": len(listed),
        "routes_checked": len(routes),
        "requests": 2 + 2 * len(routes),
        "v1_models_with_key": key_ok,
        "results": results,
        "open": [f"{f['method']} {f['path']}" for f in failures if f["expect"] == 401],
        "passed": not failures and key_ok != 401,
        "_failures": failures,
    }


def describe(f: dict[str, Any]) -> str:
    route = f"{f['method']} {f['path']}"
    if f["expect"] == 200:
        return f"{route} answered {f['no_key']} without a key; it must stay open (200)"
    if f["no_key"] != 401:
        return f"open route: {route} answered {f['no_key']} without a key (want 401)"
    return f"open route: {route} answered {f['wrong_key']} with a wrong key (want 401)"


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python3 -m e2e.route_check")
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--api-key-file", type=Path, required=True, help="file holding the key")
    p.add_argument("--json", type=Path, help="write the report here (routes.json)")
    p.add_argument("--timeout", type=float, default=10.0, help="per request, s (default 10)")
    p.add_argument("--deadline", type=float, default=120.0, help="whole check, s (default 120)")
    p.add_argument("--max-routes", type=int, default=300, help="refuse more (default 300)")
    args = p.parse_args(argv)
    url = urllib.parse.urlsplit(args.base_url)
    if url.scheme != "http" or not url.hostname or url.path not in ("", "/"):
        print(f"error: --base-url must be http://HOST:PORT, got {args.base_url!r}", file=sys.stderr)
        return 2
    if not loopback(url.hostname):
        print(f"error: {url.hostname} is not a loopback address", file=sys.stderr)
        return 2
    if args.timeout <= 0 or args.deadline <= 0 or args.max_routes < 1:
        print("error: --timeout, --deadline and --max-routes must be positive", file=sys.stderr)
        return 2
    try:
        key = args.api_key_file.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read --api-key-file: {exc}", file=sys.stderr)
        return 2
    if not key:
        print(f"error: {args.api_key_file} is empty", file=sys.stderr)
        return 2
    client = Client(url.hostname, url.port or 80, args.timeout, time.monotonic() + args.deadline)
    report: dict[str, Any] = {"base_url": args.base_url}
    rc, msg = 0, ""
    try:
        report |= check(client, key, args.max_routes)
        failures = report.pop("_failures")
        if failures:
            rc, msg = 1, describe(failures[0])
        elif report["v1_models_with_key"] == 401:
            rc, msg = 1, "GET /v1/models with the key answered 401: the key does not work"
    except CheckError as exc:
        rc, msg = 1, str(exc)
        report |= {"passed": False, "error": msg}
    if args.json:
        try:
            safe_files.write_atomic(args.json, (json.dumps(report, indent=2) + "\n").encode())
        except OSError as exc:
            rc, msg = 1, msg or f"cannot write {args.json}: {exc}"
    if rc:
        print(f"error: {msg}".replace("\n", " "), file=sys.stderr)
    else:
        print(
            f"routes: {report['routes_checked']} checked ({report['routes_listed']} listed by "
            f"/openapi.json), {report['requests']} requests: every route needs the key, "
            "/health and /ping open"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
