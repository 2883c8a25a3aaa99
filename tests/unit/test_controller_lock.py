"""scripts/controller_lock.py: one lock for Python 3.11-3.13, written only when they agree.

pip's resolver needs the package index, so these tests stand in for `resolve` (simulated
resolutions); `make lock` is the real run (README: 64 pins, identical for 3.11, 3.12, 3.13).
"""

from __future__ import annotations

from pathlib import Path

import controller_lock
import pytest


def _simulated(results: dict[str, list[str]]):
    def resolve(requirements: Path, version: str, scratch: Path) -> list[str]:
        return results[version]

    return resolve


def test_identical_resolutions_write_one_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    same = ["ansible==12.3.0", "ansible-compat==26.10.0", "fabric==3.2.3"]
    monkeypatch.setattr(
        controller_lock, "resolve", _simulated(dict.fromkeys(["3.11", "3.12", "3.13"], same))
    )
    out = tmp_path / "controller.txt"
    assert controller_lock.main(["--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].endswith("identical for Python 3.11, 3.12, 3.13.")
    assert lines[1:] == same
    assert capsys.readouterr().out == f"{out}: 3 pins, Python 3.11, 3.12, 3.13\n"


def test_differing_resolutions_write_nothing_and_name_the_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = {"3.11": ["numpy==2.3.5"], "3.12": ["numpy==2.3.5"], "3.13": ["numpy==2.4.0"]}
    monkeypatch.setattr(controller_lock, "resolve", _simulated(results))
    out = tmp_path / "controller.txt"
    out.write_text("old\n")
    assert controller_lock.main(["--output", str(out)]) == 1
    assert capsys.readouterr().err == (
        "error: Python 3.13 resolves differently from 3.11: numpy==2.3.5, numpy==2.4.0;"
        " lock per version\n"
    )
    assert out.read_text() == "old\n"


def test_the_committed_lock_covers_the_direct_pins_in_pip_freeze_order() -> None:
    repo = Path(controller_lock.__file__).resolve().parent.parent
    lines = [x for x in (repo / "requirements/controller.txt").read_text().splitlines() if x]
    pins = [x for x in lines if not x.startswith("#")]
    names = [p.split("==")[0] for p in pins]
    assert names == sorted(names, key=str.lower)  # what controller_lock writes: no churn
