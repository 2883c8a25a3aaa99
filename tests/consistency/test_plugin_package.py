"""The plugin package: pin and entry point as DESIGN/STYLE fix them; importing it is light."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
from support.plugin import BACKEND_SRC, REPO, run_python

PYPROJECT = REPO / "backend" / "pyproject.toml"


def test_pyproject_pins_vllm_exactly_and_names_the_entry_point() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == "vllm-sparse-mla"
    assert project["dependencies"] == ["vllm==0.23.0"]
    assert project["entry-points"]["vllm.general_plugins"] == {
        "sparse_mla": "vllm_sparse_mla:register"
    }


def test_plugin_version_constant_matches_the_pyproject_pin() -> None:
    init = (BACKEND_SRC / "vllm_sparse_mla" / "__init__.py").read_text()
    constant = re.search(r'^_VLLM_VERSION = "([^"]+)"', init, re.M).group(1)
    pin = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"][0]
    assert pin == f"vllm=={constant}"


@pytest.mark.runtime
def test_import_loads_no_torch_triton_or_vllm() -> None:
    code = (
        "import json, sys, vllm_sparse_mla; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'triton', 'vllm'))))"
    )
    proc = run_python(["-c", code], pythonpath=[BACKEND_SRC])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
