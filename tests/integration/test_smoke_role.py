"""The vllm_smoke role, run for real by ansible-playbook (local connection) on loopback servers.

The role copies scripts/ to a scratch "host" directory and runs smoke_test.py there with the
controller venv's python, against `FakeOpenAIServer` (a healthy endpoint) or one that never
answers. What is proven: the request and task timeouts reach the run, a hung endpoint fails the
play within vllm_smoke_task_timeout with one clear error, and the key never reaches the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.deploy import REPO, VENV_BIN
from support.fake_openai_server import Behaviour, FakeOpenAIServer

KEY = "sk-role-test-key-0123456789"

PLAY = [
    {
        "name": "Smoke role under test",
        "hosts": "all",
        "gather_facts": False,
        "roles": ["vllm_smoke"],
    }
]


def _run_role(tmp_path: Path, base_url: str, **overrides: Any) -> tuple[int, str, float]:
    host = tmp_path / "host"
    key_file = tmp_path / "api-key.env"
    key_file.write_text(f"VLLM_API_KEY={KEY}\n")
    key_file.chmod(0o600)
    variables = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        "vllm_smoke_venv_path": str(VENV_BIN.parent),
        "vllm_smoke_src_dir": str(host / "src"),
        "vllm_smoke_base_url": base_url,
        "vllm_smoke_key_file": str(key_file),
        "vllm_smoke_model": "glm-5",
        "vllm_smoke_requests": 2,
        "vllm_smoke_concurrency": 2,
        "vllm_smoke_report_path": str(tmp_path / "smoke.json"),
        **overrides,
    }
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    # The role copies {{ playbook_dir }}/../scripts/...: a play beside a link to scripts/.
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    play = tmp_path / "playbooks/play.yml"
    play.write_text(yaml.safe_dump(PLAY, sort_keys=False))
    env = dict(
        os.environ,
        ANSIBLE_ROLES_PATH=str(REPO / "playbooks/roles"),
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    start = time.monotonic()
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "smoke-host,", "-e", f"@{tmp_path / 'vars.yml'}",
         str(play)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _assert_play_failed(rc: int, output: str, line: str) -> None:
    """The play failed (ansible-playbook exit 2) with LINE in its output, and no key shown."""
    assert rc == 2, output[-4000:]
    assert line in output
    assert KEY not in output


def test_healthy_endpoint_passes_with_the_request_timeout_passed_on(tmp_path: Path) -> None:
    behaviour = Behaviour(models=["glm-5"], api_key=KEY, chunk_delay_s=0.01)
    with FakeOpenAIServer(behaviour) as server:
        rc, output, _ = _run_role(tmp_path, server.base_url, vllm_smoke_request_timeout=17)
    assert rc == 0, output[-4000:]
    assert KEY not in output
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert report["passed"] is True
    assert report["settings"]["timeout_s"] == 17.0
    assert "result              PASS (9/9 checks passed, 0 skipped)" in output  # parsers on
    assert list(report["checks"])[-3:] == ["tools", "tools_stream", "reasoning"]


def test_parser_checks_off_and_a_refused_tool_request(tmp_path: Path) -> None:
    """Off: the six base checks only. On against a server without a tool parser: the play fails
    with the client's reason (vLLM's HTTP 400), key redacted."""
    behaviour = Behaviour(models=["glm-5"], api_key=KEY, tools_refused=True)
    with FakeOpenAIServer(behaviour) as server:
        rc, output, _ = _run_role(
            tmp_path, server.base_url, vllm_smoke_tools=False, vllm_smoke_reasoning=False
        )
        assert rc == 0, output[-4000:]
        assert "result              PASS (6/6 checks passed, 0 skipped)" in output
        assert not [b for b in server.bodies if b.get("tools")]
        (tmp_path / "on").mkdir()
        rc, output, _ = _run_role(tmp_path / "on", server.base_url)
    _assert_play_failed(
        rc,
        output,
        f"error: tools: HTTP 400 from POST {server.base_url}/chat/completions: "
        '\\"auto\\" tool choice requires --enable-auto-tool-choice',
    )


def test_hung_endpoint_fails_the_play_within_the_task_timeout(tmp_path: Path) -> None:
    # The server takes every request and never answers; the client alone would wait 120 s.
    behaviour = Behaviour(models=["glm-5"], api_key=KEY, sleep_s=600)
    with FakeOpenAIServer(behaviour) as server:
        rc, output, seconds = _run_role(
            tmp_path, server.base_url, vllm_smoke_request_timeout=120, vllm_smoke_task_timeout=12
        )
        assert server.requests, output[-3000:]  # the run reached the endpoint, then was cut off
    _assert_play_failed(
        rc,
        output,
        f"error: smoke-host: smoke test against {server.base_url} did not finish within 12 s "
        "(vllm_smoke_task_timeout)",
    )
    assert seconds < 100  # far below the client's 120 s: the task timeout ended it
    assert not (tmp_path / "smoke.json").exists()


@pytest.mark.parametrize(("task_timeout", "request_timeout"), [(0, 60), (86401, 60), (900, 0)])
def test_unbounded_or_inconsistent_timeouts_are_refused(
    tmp_path: Path, task_timeout: int, request_timeout: int
) -> None:
    rc, output, _ = _run_role(
        tmp_path,
        "http://127.0.0.1:9/v1",
        vllm_smoke_task_timeout=task_timeout,
        vllm_smoke_request_timeout=request_timeout,
    )
    _assert_play_failed(
        rc,
        output,
        "error: vllm_smoke_task_timeout must be 1..86400 s and vllm_smoke_request_timeout >= 1 s "
        f"(got {task_timeout} and {request_timeout})",
    )
    assert not (tmp_path / "host").exists()  # refused before anything was copied
