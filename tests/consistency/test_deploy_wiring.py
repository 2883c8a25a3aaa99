"""The deployment's wiring agrees with itself: shipped tools, handler topics, playbooks, pins."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "playbooks/roles"
SCRIPTS = REPO / "scripts"
# role -> (its internal list of shipped tools, the tools its tasks run)
SHIPPING = {
    "gguf_weights": ("__gguf_weights_tools", ("gguf_merge.py", "gguf_types_check.py")),
    "vllm_patches": ("__vllm_patches_tools", ("vllm_patches.py",)),
    "vllm_smoke": ("__vllm_smoke_tools", ("smoke_test.py",)),
}


def _yaml(path: Path):
    return yaml.safe_load(path.read_text())


def _tasks(role: str) -> str:
    return "\n".join(p.read_text() for p in sorted((ROLES / role / "tasks").glob("*.yml")))


def _local_imports(path: Path) -> set[str]:
    """Modules of scripts/ that PATH imports (absolute imports by module name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module.split(".")[0]]
        found |= {f"{n}.py" for n in names if (SCRIPTS / f"{n}.py").is_file()}
    return found


@pytest.mark.parametrize("role", sorted(SHIPPING))
def test_a_role_ships_its_tool_and_every_module_the_tool_imports(role: str) -> None:
    var, tools = SHIPPING[role]
    shipped = _yaml(ROLES / role / "vars/main.yml")[var]
    assert set(tools) <= set(shipped)
    assert all(f"scripts/{tool}" in _tasks(role) for tool in tools), f"{role} runs {tools}"
    assert all((SCRIPTS / name).is_file() for name in shipped), shipped
    closure, todo = set(), list(tools)
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += sorted(_local_imports(SCRIPTS / name))
    assert set(shipped) == closure, f"{role}: ship exactly {sorted(closure)}"


def test_no_role_copies_the_whole_scripts_directory() -> None:
    for role in sorted(p.name for p in ROLES.iterdir()):
        text = _tasks(role)
        assert not re.search(r"\.\./scripts/\"", text), f"{role} copies all of scripts/"
        assert "loop: [scripts" not in text, role


def test_tests_and_fixtures_are_never_shipped() -> None:
    for role, (var, _tools) in SHIPPING.items():
        for name in _yaml(ROLES / role / "vars/main.yml")[var]:
            assert not name.startswith(("test_", "tiny_")), f"{role} ships the fixture {name}"


def _handlers() -> dict[str, list[str]]:
    """Every handler name and listen topic -> the roles defining it."""
    defined: dict[str, list[str]] = {}
    for path in sorted(ROLES.glob("*/handlers/main.yml")):
        for handler in _yaml(path) or []:
            listen = handler.get("listen", [])
            for name in [handler["name"], *([listen] if isinstance(listen, str) else listen)]:
                defined.setdefault(name, []).append(path.parts[-3])
    return defined


def test_every_notify_reaches_a_topic_defined_in_one_role() -> None:
    defined = _handlers()
    notified = set()
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        notified |= set(re.findall(r"^\s+notify:\s*(.+?)\s*$", path.read_text(), re.M))
    assert notified, "no notify found"
    for topic in notified:
        owners = set(defined.get(topic, []))
        assert len(owners) == 1, f"notify {topic!r}: defined in {sorted(owners) or 'no role'}"
    assert defined["vllm service inputs changed"] == ["vllm_service", "vllm_service"]


def test_the_api_key_expression_is_written_once_in_the_smoke_role() -> None:
    text = _tasks("vllm_smoke")
    assert text.count("b64decode") == 1
    assert "{{ vllm_smoke_secret }}" in text


def test_site_imports_smoke_yml_instead_of_repeating_its_wiring() -> None:
    site = _yaml(REPO / "playbooks/site.yml")
    imports = [
        p["ansible.builtin.import_playbook"] for p in site if "ansible.builtin.import_playbook" in p
    ]
    assert imports == ["cluster.yml", "smoke.yml"]
    assert "vllm_smoke" not in (REPO / "playbooks/site.yml").read_text()


@pytest.mark.parametrize("playbook", ["smoke.yml", "verify.yml"])
def test_day2_playbooks_first_check_that_the_host_was_deployed(playbook: str) -> None:
    first = _yaml(REPO / "playbooks" / playbook)[0]["tasks"][0]
    assert first["ansible.builtin.import_role"] == {
        "name": "vllm_service",
        "tasks_from": "deployed.yml",
    }


def test_no_playbook_restates_a_role_default() -> None:
    text = "\n".join(p.read_text() for p in (REPO / "playbooks").glob("*.yml"))
    assert not re.search(r"default\('/(etc|opt|var|srv)/", text), "a role default restated"


def test_fabfiles_restate_no_role_default() -> None:
    for name in ("fabfile.py", "fabfile_cluster.py"):
        text = (REPO / name).read_text()
        for literal in ("glm5-vllm", "glm5-ray", "8000", "/opt/glm5", "6379", "hosts.example"):
            assert literal not in text.split('"""', 2)[2], f"{name} restates {literal}"


def test_group_vars_restate_no_role_default() -> None:
    group_vars = _yaml(REPO / "inventory/group_vars/all.yml")
    defaults: dict = {}
    for path in sorted(ROLES.glob("*/defaults/main.yml")):
        defaults |= _yaml(path)
    for name, value in group_vars.items():
        if name.startswith("glm5_"):
            assert name not in defaults, name
            continue
        assert name in defaults, f"{name} in group_vars belongs to no role"
        assert isinstance(value, str) and "{{" in value, f"{name}: restates its role default"


def test_an_inline_group_var_of_the_cluster_example_is_not_shadowed_by_group_vars() -> None:
    """group_vars/all.yml outranks inline inventory vars: restating a default there hid them."""
    import ansible_targets

    inventory = REPO / "inventory/cluster.example.yml"
    gpu02 = ansible_targets.HostVars("gpu02", inventory)
    assert gpu02["gguf_weights_shard_dir"] == "/data/GLM-5-GGUF/Q4_K_M"
    assert gpu02["vllm_runtime_vllm_version"] == "0.23.0"  # role default -> the group_vars pin
