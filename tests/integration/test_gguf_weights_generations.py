"""gguf_weights picks the HF config/tokenizer files per GLM generation (a real Ansible run).

The role runs on this machine (connection local) with the merge off and a local source directory
holding a tiny checkpoint's config/tokenizer files (tests/support/tiny_glm5.py's config.json), so
nothing is fetched. Checked: the hub repository each generation resolves to, the refusal of an
unknown generation, and the refusal of config.json of another generation than the one chosen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import tiny_glm5

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = """\
- name: gguf_weights alone
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - gguf_weights
  post_tasks:
    - name: Report the hub repository
      ansible.builtin.debug:
        msg: "repo={{ gguf_weights_hf_repo }}"
  handlers:
    - name: vllm service inputs changed
      ansible.builtin.debug:
        msg: changed
"""


def play(tmp: Path, **extra: object) -> subprocess.CompletedProcess[str]:
    (tmp / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_ROLES_PATH=str(REPO / "playbooks" / "roles"))  # fmt: skip
    args = {"gguf_weights_merge": False, "gguf_weights_hf_dir": str(tmp / "hf"),
            "ansible_python_interpreter": sys.executable} | extra  # fmt: skip
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
         str(tmp / "play.yml"), "-e", json.dumps(args)],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def source(tmp: Path, generation: str) -> Path:
    """A local HF folder: the tiny model's config.json of GENERATION and a tokenizer file."""
    src = tmp / f"src{generation}"
    src.mkdir()
    cfg = tiny_glm5.config(7, 0, generation=generation)
    (src / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (src / "tokenizer.json").write_text(json.dumps({"generation": generation}) + "\n")
    return src


@pytest.mark.parametrize(
    ("generation", "repo"),
    [("5", "zai-org/GLM-5"), ("5.1", "zai-org/GLM-5.1"), ("5.2", "zai-org/GLM-5.2")],
)
def test_generation_picks_its_repo_and_places_its_config(
    tmp_path: Path, generation: str, repo: str
) -> None:
    src = source(tmp_path, generation)
    res = play(tmp_path, gguf_weights_generation=generation, gguf_weights_hf_source_dir=str(src))
    assert res.returncode == 0, res.stdout[-3000:]
    assert f'"msg": "repo={repo}"' in res.stdout
    placed = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert placed == json.loads((src / "config.json").read_text()) | {
        "indexer_rope_interleave": True
    }
    assert ("indexer_types" in placed) == (generation == "5.2")
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (
        src / "tokenizer.json"
    ).read_bytes()


def test_unknown_generation_is_refused_before_anything_is_placed(tmp_path: Path) -> None:
    res = play(tmp_path, gguf_weights_generation="5.3",
               gguf_weights_hf_source_dir=str(source(tmp_path, "5.2")))  # fmt: skip
    assert res.returncode == 2, res.stdout[-3000:]
    assert (
        'gguf_weights_generation "5.3" is not a known GLM generation; choose one of 5, 5.1, 5.2'
        in res.stdout
    )
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(("chosen", "files"), [("5.2", "5.1"), ("5.1", "5.2")])
def test_config_of_another_generation_is_refused(tmp_path: Path, chosen: str, files: str) -> None:
    src = source(tmp_path, files)
    res = play(tmp_path, gguf_weights_generation=chosen, gguf_weights_hf_source_dir=str(src))
    assert res.returncode == 2, res.stdout[-3000:]
    kind = (
        "GLM-5.2 (it lists indexer_types)" if files == "5.2" else "GLM-5 or 5.1 (no indexer_types)"
    )
    assert (
        f'{src} has a config.json of {kind}, but gguf_weights_generation is "{chosen}": the HF '
        "files must be of the GGUF's generation" in res.stdout
    )
    assert not (tmp_path / "hf" / "config.json").exists()
