"""The service unit's MTP speculative-decoding flag (vllm_service_speculative_tokens), rendered by
Ansible's own templating like tests/consistency/test_service_parsers.py: off by default, one
--speculative-config with vLLM's JSON for k = 1..3 (the draft on the CUSTOM backend), nothing
else moved; the argument spec allows exactly 0..3.
"""

from __future__ import annotations

import json

import pytest
import yaml
from test_service_parsers import ROLE, exec_start, render_unit


def test_off_by_default() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert defaults["vllm_service_speculative_tokens"] == 0
    assert "--speculative-config" not in exec_start(render_unit())


@pytest.mark.parametrize("k", [1, 2, 3])
def test_renders_vllm_speculative_config(k: int) -> None:
    base = exec_start(render_unit())
    argv = exec_start(render_unit(vllm_service_speculative_tokens=k))
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == {
        "method": "mtp",
        "num_speculative_tokens": k,
        "attention_backend": "CUSTOM",
    }
    assert argv[:i] + argv[i + 2 :] == base


def test_argument_spec_allows_0_to_3() -> None:
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    spec = specs["argument_specs"]["main"]["options"]["vllm_service_speculative_tokens"]
    assert spec["type"] == "int" and spec["default"] == 0 and spec["choices"] == [0, 1, 2, 3]


def test_nextn_check_runs_before_the_unit_with_the_venv_python() -> None:
    tasks = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    names = [t["name"] for t in tasks]
    check = names.index("Service | Refuse MTP speculative decoding without the GGUF's nextn layer")
    assert check < names.index("Service | Install the systemd unit")
    task = tasks[check]
    assert task["ansible.builtin.script"]["cmd"].startswith(
        "{{ playbook_dir }}/../scripts/gguf_nextn.py "
    )
    assert task["ansible.builtin.script"]["executable"] == "{{ vllm_service_venv_path }}/bin/python"
    assert "vllm_service_speculative_tokens | int > 0" in task["when"]
