"""Apply, verify or revert the GLM-5 GGUF patch series on an installed vLLM.

The vLLM version is read from DIR/vllm/_version.py (vllm is never imported) and picks
patches/vllm-<version>/. Patches are applied with GNU patch (-p1 in DIR), all files or none.

  status    per touched file: pristine, patched or drifted (matches neither MANIFEST hash)
  verify    exit 0 only if the series is consistent (series, headers, MANIFEST) and every file
            is patched and reverses cleanly to its pristine bytes
  apply     patch every pristine file; a no-op that says so when already patched; refuses drifted
  revert    restore the pristine bytes of every patched file; a no-op when already pristine
  manifest  (maintainers) rewrite MANIFEST from a pristine DIR after changing the series

Every command refuses an incomplete or inconsistent series (a listed patch missing, an unlisted
one, a bad header, MANIFEST out of step): each would otherwise act on part of the series. The tree
is locked while a command runs (shared for status/verify, exclusive for apply/revert, waiting up to
--lock-timeout). Temp files a killed run left beside the touched files are removed by apply and
revert and reported (an error) by status and verify. Under --json every outcome, failures
included (unreadable or non-UTF-8 files, permission errors, a held lock), is one JSON object with
the keys in JSON_KEYS, and `error: ...` on stderr.

Exit: 0 ok, 1 check failed / refused / patch failure / unsupported version / I/O error, 2 usage.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import sysconfig
from pathlib import Path

import cli_args
import patchset as ps
import safe_files

EXAMPLES = """examples:
  python scripts/vllm_patches.py status
  SITE=/opt/vllm/lib/python3.11/site-packages
  python scripts/vllm_patches.py apply --site-packages "$SITE"
  python scripts/vllm_patches.py verify --json --site-packages "$SITE"
  python scripts/vllm_patches.py manifest --site-packages /tmp/pristine  # maintainers
"""


# Every --json report has exactly these keys (null where unknown, e.g. after an error).
JSON_KEYS = (
    "command", "site_packages", "vllm_version", "series_dir", "patches", "problems", "changed",
    "files", "state", "ok", "message",
)  # fmt: skip


def default_site_packages() -> Path:
    """The directory that holds the running interpreter's vllm/ (found, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).parent
    return Path(sysconfig.get_paths()["purelib"])


def overall(states: list[str]) -> str:
    if states and all(s == ps.PATCHED for s in states):
        return ps.PATCHED
    if states and all(s == ps.PRISTINE for s in states):
        return ps.PRISTINE
    if any(s in (ps.DRIFTED, ps.MISSING) for s in states):
        return ps.DRIFTED
    return "partial"


def run(
    command: str, site: Path, patches_root: Path, lock_timeout: float = ps.LOCK_TIMEOUT
) -> dict:
    version = ps.vllm_version(site)
    with ps.locked(site, exclusive=command in ("apply", "revert"), timeout=lock_timeout):
        return _run_locked(command, site, patches_root, version)


def _run_locked(command: str, site: Path, patches_root: Path, version: str) -> dict:
    series = ps.load_series(version, patches_root)
    report: dict = {
        "command": command,
        "site_packages": str(site),
        "vllm_version": version,
        "series_dir": str(series.directory),
        "patches": [p.name for p in series.patches],
        "problems": list(series.problems),
        "changed": False,
    }

    if command == "manifest":
        # MANIFEST problems are what this command fixes; any other problem still stops it
        blocking = [p for p in series.problems if not p.startswith("MANIFEST: ")]
        if blocking:
            report.update(ok=False, files=[], state=None)
            report["message"] = "series is inconsistent: " + "; ".join(blocking)
            return report
        ps.check_targets(site, series.files)
        entries = {}
        after = ps.transform(series, site, series.files, reverse=False, check=False)
        for path in series.files:
            entries[path] = (ps.sha256((site / path).read_bytes()), ps.sha256(after[path]))
        safe_files.write_atomic(series.directory / "MANIFEST", ps.format_manifest(entries).encode())
        report.update(ok=True, changed=True, state=ps.PRISTINE, files=[], problems=[])
        report["message"] = f"wrote {series.directory / 'MANIFEST'} ({len(entries)} files)"
        return report

    if series.problems:  # every command: a partial series would act on part of the files
        report.update(ok=False, files=[], state=None)
        report["message"] = "series is inconsistent: " + "; ".join(series.problems)
        return report
    ps.check_targets(site, series.files)
    left = ps.leftovers(site, series.files)
    if left and command in ("status", "verify"):
        report.update(ok=False, files=[], state=None)
        report["message"] = (
            "temp files of an interrupted apply/revert are in the tree (apply or revert removes "
            "them): " + ", ".join(str(p) for p in left)
        )
        return report
    removed = []
    for leftover in left:
        leftover.unlink(missing_ok=True)
        removed.append(str(leftover))
    files = []
    for path in series.files:
        state, digest = ps.file_state(series, site, path)
        files.append({"path": path, "state": state, "sha256": digest})
    states = [f["state"] for f in files]
    report.update(files=files, state=overall(states))
    by_state = {s: [f["path"] for f in files if f["state"] == s] for s in set(states)}
    drifted = by_state.get(ps.DRIFTED, []) + by_state.get(ps.MISSING, [])

    if command == "status":
        report.update(ok=True, message=f"vLLM {version}: {report['state']}")
    elif command == "verify":
        if report["state"] != ps.PATCHED:
            bad = [f"{f['path']} is {f['state']}" for f in files if f["state"] != ps.PATCHED]
            report.update(ok=False, message="not patched: " + "; ".join(bad))
        else:
            ps.transform(series, site, series.files, reverse=True)  # reverses to pristine bytes
            report.update(ok=True, message=f"vLLM {version}: all {len(files)} files patched")
    elif command in ("apply", "revert"):
        forward = command == "apply"
        source, target = (ps.PRISTINE, ps.PATCHED) if forward else (ps.PATCHED, ps.PRISTINE)
        todo = by_state.get(source, [])
        if drifted:
            why = " (another vLLM build or local edits; reinstall vllm, then apply)"
            report.update(
                ok=False,
                message=f"refusing to {'patch' if forward else 'revert'}; these files match "
                f"neither MANIFEST hash{why if forward else ''}: " + ", ".join(drifted),
            )
        elif not todo:
            report.update(ok=True, message=f"already {target}: all {len(files)} files, no change")
        else:
            ps.install(site, ps.transform(series, site, todo, reverse=not forward))
            report.update(ok=True, changed=True, state=target)
            verb = "patched" if forward else "reverted"
            report["message"] = f"{verb} {len(todo)} files: " + ", ".join(todo)
    if report["changed"]:
        for f in report["files"]:
            f["state"], f["sha256"] = ps.file_state(series, site, f["path"])
    if removed:
        report["changed"] = True
        report["message"] += f"; removed {len(removed)} leftover temp files: " + ", ".join(removed)
    return report


def print_text(report: dict) -> None:
    for f in report.get("files", []):
        print(f"{f['state']:<9} {f['path']}")
    for problem in report.get("problems", []):
        print(f"warning: {problem}", file=sys.stderr)
    if report["ok"]:
        print(report["message"])
    else:
        print(f"error: {_one_line(report['message'])}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = cli_args.parser(__doc__, EXAMPLES)
    p.add_argument(
        "command",
        choices=["status", "verify", "apply", "revert", "manifest"],
        help="what to do (manifest: maintainers only, on a pristine vLLM)",
    )
    p.add_argument(
        "--site-packages",
        type=Path,
        default=None,
        help="directory holding vllm/ (default: the running interpreter's)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with stable keys")
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=ps.LOCK_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for another run's lock on the tree (default: %(default)s)",
    )
    p.add_argument(
        "--patches-dir",
        type=Path,
        default=ps.PATCHES_ROOT,
        help="directory of vllm-<version>/ series (default: %(default)s)",
    )
    args = p.parse_args(argv)
    site = args.site_packages or default_site_packages()
    try:
        report = run(args.command, site, args.patches_dir, args.lock_timeout)
    except ps.PatchError as exc:
        report = _failure(args.command, site, str(exc))
    except (
        OSError
    ) as exc:  # a write refused mid-install (read-only tree, disk full): files restored
        where = f"{exc.filename}: " if exc.filename else ""
        report = _failure(args.command, site, f"{where}{exc.strerror or exc}")
    except Exception as exc:
        if not args.json:
            raise  # unexpected: keep the traceback
        report = _failure(args.command, site, f"unexpected {type(exc).__name__}: {exc}")
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        if not report["ok"]:
            print(f"error: {_one_line(report['message'])}", file=sys.stderr)
    else:
        print_text(report)
    return 0 if report["ok"] else 1


def _failure(command: str, site: Path, message: str) -> dict:
    report = dict.fromkeys(JSON_KEYS)
    report.update(command=command, site_packages=str(site), ok=False, changed=False,
                  message=message, files=[], patches=[], problems=[])  # fmt: skip
    return report


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


if __name__ == "__main__":
    sys.exit(main())
