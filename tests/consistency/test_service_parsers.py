"""The service unit's tool-call and reasoning parser flags, rendered by Ansible's own templating.

The whole vllm.service.j2 is rendered with the role's defaults and vars (what the role writes,
without a host), ExecStart is split as systemd splits it, and the argv is compared: on by
default, each flag group gone when its variable is "", nothing else moved.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml
from support.deploy import REPO

ROLE = REPO / "playbooks/roles/vllm_service"
PARSER_FLAGS = [
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "glm47",
    "--reasoning-parser",
    "glm45",
]


def render_unit(**overrides: Any) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    variables |= yaml.safe_load((ROLE / "vars/main.yml").read_text())
    variables |= {"ansible_managed": "Ansible managed"} | overrides
    # role files are trusted templates in a play; yaml.safe_load strings are not until marked
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template((ROLE / "templates/vllm.service.j2").read_text()))


def exec_start(unit: str) -> list[str]:
    """ExecStart's argv: continuation lines joined, split with shell quoting as systemd does."""
    lines = unit.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    command = []
    for line in lines[start:]:
        command.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(command).removeprefix("ExecStart="))


def test_parsers_are_on_by_default() -> None:
    argv = exec_start(render_unit())
    assert argv[:2] == ["/opt/glm5/venv/bin/vllm", "serve"]
    i = argv.index("--enable-auto-tool-choice")
    assert argv[i : i + 5] == PARSER_FLAGS
    assert argv[i - 1] == "--disable-custom-all-reduce"  # after the existing flags
    assert argv.count("--tool-call-parser") == argv.count("--reasoning-parser") == 1


@pytest.mark.parametrize(
    ("tool", "reasoning", "expected"),
    [
        ("", "glm45", ["--reasoning-parser", "glm45"]),
        ("glm47", "", ["--enable-auto-tool-choice", "--tool-call-parser", "glm47"]),
        (
            "glm45",
            "glm45",
            [
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "glm45",
                "--reasoning-parser",
                "glm45",
            ],
        ),  # fmt: skip
        ("", "", []),
    ],
)
def test_empty_string_turns_a_parser_off(tool: str, reasoning: str, expected: list[str]) -> None:
    default = exec_start(render_unit())
    i = default.index("--enable-auto-tool-choice")
    argv = exec_start(
        render_unit(vllm_service_tool_call_parser=tool, vllm_service_reasoning_parser=reasoning)
    )
    assert argv == default[:i] + expected + default[i + len(PARSER_FLAGS) :]


def test_extra_args_stay_last() -> None:
    argv = exec_start(render_unit(vllm_service_extra_args=["--enforce-eager", "--seed 7"]))
    assert argv[-len(PARSER_FLAGS) - 3 :] == [*PARSER_FLAGS, "--enforce-eager", "--seed", "7"]


@pytest.mark.parametrize("pcie", [True, False])
@pytest.mark.parametrize("parsers", ["", "on"])
def test_execstart_ends_on_its_own_line(pcie: bool, parsers: str) -> None:
    off = (
        {}
        if parsers
        else {"vllm_service_tool_call_parser": "", "vllm_service_reasoning_parser": ""}
    )
    lines = render_unit(vllm_service_pcie_consumer_cards=pcie, **off).splitlines()
    last = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    while lines[last].endswith("\\"):
        last += 1
    assert lines[last].split() == (
        PARSER_FLAGS[-2:]
        if parsers
        else (["--disable-custom-all-reduce"] if pcie else ["--gpu-memory-utilization", "0.85"])
    )
    assert lines[last + 1] == "Restart=on-failure"


def test_parser_choices_cover_the_defaults_and_off() -> None:
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    for var, default in (("tool_call_parser", "glm47"), ("reasoning_parser", "glm45")):
        option = options[f"vllm_service_{var}"]
        assert option["default"] == defaults[f"vllm_service_{var}"] == default
        assert "" in option["choices"] and default in option["choices"]


def test_prefill_chunk_stays_inside_the_gguf_moe_vec_kernels_grid() -> None:
    # 8192 (vLLM's default on a >= 70 GiB GPU) x top-8 = 65536 blocks on grid z: IQ experts fail
    argv = exec_start(render_unit())
    i = argv.index("--max-num-batched-tokens")
    assert int(argv[i + 1]) * 8 <= 65535
    assert argv[i - 2] == "--max-model-len"
    # the serving benchmark measures with the service's chunk (its own constant, one value)
    import bench_serve

    assert int(argv[i + 1]) == bench_serve.MAX_BATCHED_TOKENS
    raised = exec_start(render_unit(vllm_service_max_num_batched_tokens=16384))
    assert raised[raised.index("--max-num-batched-tokens") + 1] == "16384"
