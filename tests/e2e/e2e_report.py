"""Summarise an end-to-end run (tests/e2e/pipeline.sh) into OUT/summary.json and a short text.

Reads WORK/steps.tsv (one block per pipeline invocation: step, status, seconds), OUT/failures.json
(tests/e2e/repro_failures.py), OUT/smoke.json (scripts/smoke_test.py), OUT/routes.json
(tests/e2e/route_check.py) and WORK/logs/health.log.
The run's API key (WORK/api_key) never reaches the summary: vLLM logs its non-default arguments,
the key among them, and the summary is committed as run evidence.
Only the standard library: it runs with any python3.

    python tests/e2e/e2e_report.py --work /tmp/e2e --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_steps(path: Path) -> list[dict]:
    invocations: list[dict] = []
    if not path.is_file():
        return invocations
    for line in path.read_text().splitlines():
        if line.startswith("# invocation "):
            started, _, steps = line[len("# invocation ") :].partition(":")
            invocations.append({"started": int(started), "selected": steps.split(), "steps": []})
        elif line.strip() and invocations:
            name, status, seconds = line.split("\t")
            invocations[-1]["steps"].append(
                {"name": name, "status": status, "seconds": float(seconds)}
            )
    for inv in invocations:
        inv["seconds"] = round(sum(s["seconds"] for s in inv["steps"]), 1)
    return invocations


def load_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def redactor(work: Path):
    """A function that replaces the run's API key in a text; identity when there is none."""
    try:
        key = (work / "api_key").read_text().strip()
    except OSError:
        key = ""
    return (lambda text: text.replace(key, "<api-key>")) if key else (lambda text: text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="the pipeline's WORK folder")
    p.add_argument("--out", type=Path, required=True, help="the pipeline's OUT folder")
    args = p.parse_args(argv)

    invocations = read_steps(args.work / "steps.tsv")
    latest: dict[str, dict] = {}
    for inv in invocations:
        for s in inv["steps"]:
            latest[s["name"]] = {"status": s["status"], "seconds": s["seconds"]}
    failures = load_json(args.out / "failures.json")
    smoke = load_json(args.out / "smoke.json")
    routes = load_json(args.out / "routes.json")
    if isinstance(routes, dict):  # the verdict; routes.json itself keeps every route's statuses
        keep = ("passed", "routes_checked", "routes_listed", "requests", "open", "error")
        routes = {k: routes[k] for k in keep if k in routes}
    health = args.work / "logs" / "health.log"
    redact = redactor(args.work)
    summary = {
        "invocations": invocations,
        "latest": latest,
        "failures": failures,
        "smoke": smoke,
        "routes": routes,
        "server_highlights": redact(health.read_text()).splitlines() if health.is_file() else [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    print("== summary")
    for name, s in latest.items():
        print(f"  {name:<8} {s['status']:<8} {s['seconds']:>7.1f} s")
    if invocations:
        print(f"  this invocation: {invocations[-1]['seconds']} s of steps")
    if isinstance(failures, dict):
        for c in failures.get("cases", []):
            mark = "ok " if c.get("as_expected") else "BAD"
            msg = (c.get("message") or "no error").replace("\n", " ")
            print(f"  repro {mark} {c['name']}: {c.get('error_type')}: {msg[:300]}")
    if routes is not None:
        print("  routes:", json.dumps(routes)[:600])
    if smoke is not None:
        print("  smoke:", json.dumps(smoke)[:1500])
    return 0


if __name__ == "__main__":
    sys.exit(main())
