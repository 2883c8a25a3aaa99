"""scripts/cached_venv.py: the shared runtime env is built once, under a lock, published whole."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cached_venv
import pytest

SCRIPT = Path(cached_venv.__file__)


def _run(dest: Path, requirements: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_NO_INDEX="1")  # offline: nothing to fetch
    cmd = [sys.executable, str(SCRIPT), "--requirements", str(requirements), str(dest)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def requirements(tmp_path: Path) -> Path:
    path = tmp_path / "req.txt"
    path.write_text("# nothing beyond pip itself\n")
    return path


@pytest.mark.slow
def test_a_second_builder_waits_for_the_first_and_builds_nothing(
    tmp_path: Path, requirements: Path
) -> None:
    dest = tmp_path / "cache/runtime-abc"
    dest.parent.mkdir()
    lock = open(dest.with_name("runtime-abc.lock"), "a")  # noqa: SIM115  (held across the thread)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another clone's build is in progress
    results: list[subprocess.CompletedProcess] = []
    waiter = threading.Thread(target=lambda: results.append(_run(dest, requirements)))
    waiter.start()
    time.sleep(1)
    assert not dest.exists()  # it waits: it neither wipes nor builds beside the holder
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    waiter.join(300)
    first = results[0]
    assert first.returncode == 0, first.stderr
    assert f"waiting for another build of {dest}" in first.stderr
    assert dest.is_symlink() and (dest / ".installed").is_file()
    assert (dest / "bin/python").exists()
    built = list(dest.with_name("runtime-abc.builds").iterdir())
    again = _run(dest, requirements)
    assert again.returncode == 0 and again.stdout == f"{dest}\n"
    assert list(dest.with_name("runtime-abc.builds").iterdir()) == built  # no second build


@pytest.mark.slow
def test_a_failed_build_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    requirements = tmp_path / "req.txt"
    requirements.write_text("no-such-package-glm5==1.0\n")
    dest = tmp_path / "runtime-bad"
    result = _run(dest, requirements)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: building {dest} failed: ")
    assert not dest.exists() and not dest.is_symlink()
    assert list(dest.with_name("runtime-bad.builds").iterdir()) == []


def test_a_half_built_env_from_a_killed_run_is_replaced(
    tmp_path: Path, requirements: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "runtime-old"
    (dest / "bin").mkdir(parents=True)  # what the old `rm -rf; venv; pip` recipe left when killed
    stale = dest.with_name("runtime-old.builds") / "20261204T000000-1"
    stale.mkdir(parents=True)
    calls: list[Path] = []

    def fake_build(python: str, req: Path, build: Path) -> None:  # the venv itself is tested above
        calls.append(build)
        build.mkdir()
        (build / ".installed").write_text("x")

    monkeypatch.setattr(cached_venv, "_build", fake_build)
    assert cached_venv.ensure(dest, requirements, sys.executable) == dest
    assert dest.is_symlink() and dest.resolve() == calls[0].resolve()
    assert not stale.exists()
