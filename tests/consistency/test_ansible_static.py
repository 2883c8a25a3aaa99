"""Static checks of the deployment code: syntax, ansible-lint (production), argspecs, pins."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest
import yaml
from support.deploy import REPO, VENV_BIN, make

ROLES = sorted(p.name for p in (REPO / "playbooks/roles").iterdir() if p.is_dir())
PLAYBOOKS = ["site.yml", "verify.yml", "smoke.yml"]


def test_every_role_of_the_design_exists() -> None:
    assert ROLES == [
        "cuda_toolkit",
        "gguf_weights",
        "nvidia_driver",
        "preflight",
        "ray_cluster",
        "vllm_patches",
        "vllm_runtime",
        "vllm_service",
        "vllm_smoke",
    ]


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax_check(playbook: str) -> None:
    proc = subprocess.run(
        [
            str(VENV_BIN / "ansible-playbook"),
            "--syntax-check",
            "-i",
            "inventory/hosts.example.yml",
            f"playbooks/{playbook}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_ansible_lint_production_profile_is_clean() -> None:
    config = yaml.safe_load((REPO / ".ansible-lint").read_text())
    assert config["profile"] == "production"
    assert "skip_list" not in config and "warn_list" not in config
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-lint"), "--nocolor", "--format", "pep8"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_role_defaults_are_mirrored_in_argument_specs(role: str) -> None:
    root = REPO / "playbooks/roles" / role
    defaults = yaml.safe_load((root / "defaults/main.yml").read_text())
    options = yaml.safe_load((root / "meta/argument_specs.yml").read_text())["argument_specs"][
        "main"
    ]["options"]
    assert set(options) == set(defaults)
    for name, value in defaults.items():
        assert name.startswith(f"{role}_"), f"{name} lacks the {role}_ prefix"
        assert options[name]["default"] == value, name
        assert options[name].get("description"), f"{name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_templates_carry_the_ansible_managed_header(role: str) -> None:
    for template in (REPO / "playbooks/roles" / role / "templates").glob("*.j2"):
        first = template.read_text().splitlines()[0]
        # data for lookups, never files on a host
        lookups = (
            "refusals.j2",
            "stamp.j2",
            "probe_targets.j2",
            "report_diff.j2",
            "unknown_vars.j2",
        )
        if template.name in lookups:
            continue
        assert first == "{{ ansible_managed | comment }}", template


def test_role_pins_refer_to_the_group_vars_pins() -> None:
    group_vars = yaml.safe_load((REPO / "inventory/group_vars/all.yml").read_text())
    runtime = yaml.safe_load((REPO / "playbooks/roles/vllm_runtime/defaults/main.yml").read_text())
    for package in ("vllm", "transformers", "torch", "gguf"):
        assert group_vars[f"glm5_{package}_version"]
        assert runtime[f"vllm_runtime_{package}_version"] == f"{{{{ glm5_{package}_version }}}}"
        assert f"vllm_runtime_{package}_version" not in group_vars  # one home: the pin


def test_service_unit_serves_the_gguf_the_design_way() -> None:
    unit = (REPO / "playbooks/roles/vllm_service/templates/vllm.service.j2").read_text()
    for needle in (
        "Type=exec",
        "Restart=on-failure",
        "User={{ vllm_service_user }}",
        "serve {{ vllm_service_model_path }}",
        "--hf-config-path {{ vllm_service_hf_dir }}",
        "--tokenizer {{ vllm_service_hf_dir }}",
        "--dtype float16",
        "--attention-backend CUSTOM",
        "--disable-custom-all-reduce",
    ):
        assert needle in unit
    defaults = yaml.safe_load((REPO / "playbooks/roles/vllm_service/defaults/main.yml").read_text())
    assert defaults["vllm_service_bind_address"] == "127.0.0.1"
    assert "--api-key" not in unit  # the key comes from the 0600 env file, never argv


def test_make_deploy_resolves_host_with_the_inventory_tool() -> None:
    bare = make("deploy", "-n", HOST="10.0.0.5").output
    assert 'scripts/ansible_targets.py --host "10.0.0.5"' in bare
    assert '-i "10.0.0.5,"' not in bare  # the tool decides: a group name is no bare host
    check = make("deploy", "-n", CHECK="1").output
    assert re.search(r"playbooks/site\.yml\s+--check --diff", check)


@pytest.mark.parametrize("choice", ["auto", "triton", "deepgemm"])
def test_service_renders_the_plugin_indexer_choice_the_plugin_reads(choice: str) -> None:
    """Role var -> the unit's --additional-config (Ansible's own templating) -> the plugin's
    validator: the same key and the same choices on both sides."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    from vllm_sparse_mla import indexer_hook

    role = REPO / "playbooks/roles/vllm_service"
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["vllm_service_sparse_mla_indexer"]
    assert tuple(option["choices"]) == indexer_hook.CHOICES
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    assert option["default"] == defaults["vllm_service_sparse_mla_indexer"] == indexer_hook.DEFAULT
    unit = (role / "templates/vllm.service.j2").read_text()
    (line,) = [x for x in unit.splitlines() if "--additional-config" in x]
    templar = Templar(loader=DataLoader(), variables={"vllm_service_sparse_mla_indexer": choice})
    rendered = templar.template(trust_as_template(line.removesuffix("\\")))
    flag, value = shlex.split(rendered)  # systemd unquotes '...' as the shell does here
    assert flag == "--additional-config"
    assert json.loads(value) == {indexer_hook.CONFIG_KEY: choice}
    assert indexer_hook.indexer_choice(json.loads(value)) == choice


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_ds_mla"])
def test_service_renders_kv_cache_dtype_only_when_not_auto(kv_cache_dtype: str) -> None:
    """The role's choices are what the plugin accepts; auto renders no flag (vLLM's default)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = REPO / "playbooks/roles/vllm_service"
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["vllm_service_kv_cache_dtype"]
    assert option["choices"] == ["auto", "fp8_ds_mla"]
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    assert option["default"] == defaults["vllm_service_kv_cache_dtype"] == "auto"
    unit = (role / "templates/vllm.service.j2").read_text()
    start = unit.index("{%- if vllm_service_kv_cache_dtype")
    block = unit[start : unit.index("{%- endif %}", start) + len("{%- endif %}")]
    templar = Templar(
        loader=DataLoader(), variables={"vllm_service_kv_cache_dtype": kv_cache_dtype}
    )
    rendered = templar.template(trust_as_template(block))
    if kv_cache_dtype == "auto":
        assert not rendered
    else:
        assert shlex.split(rendered.replace("\\\n", " ")) == ["--kv-cache-dtype", kv_cache_dtype]
