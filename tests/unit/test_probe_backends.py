"""scripts/probe_backends.py: its table and JSON agree with vLLM's own validation."""

from __future__ import annotations

import json

import probe_backends
import pytest

pytestmark = pytest.mark.runtime
torch = pytest.importorskip("torch")  # collected by the controller venv too, which has none

GLM5_SM120 = ["--capability", "12.0", "--dtype", "float16", "--head-size", "576", "--sparse",
              "--kv-cache-dtype", "auto", "--block-size", "64"]  # fmt: skip


def _probe_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    rc = probe_backends.main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _vllm_verdict(name: str, capability: str, cfg: dict) -> list[str]:
    """Ask the backend class directly, as vLLM's CUDA platform does when selecting."""
    from vllm.config import CacheConfig, DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    cls = AttentionBackendEnum[name].get_class()
    major, minor = (int(x) for x in capability.split("."))
    config = VllmConfig(
        device_config=DeviceConfig(device="cuda"),
        cache_config=CacheConfig(block_size=cfg["block_size"]),
    )
    with set_current_vllm_config(config):
        return cls.validate_configuration(
            head_size=cfg["head_size"],
            dtype=getattr(torch, cfg["dtype"]),
            kv_cache_dtype=cfg["kv_cache_dtype"],
            block_size=cfg["block_size"],
            use_mla=cfg["use_mla"],
            has_sink=False,
            use_sparse=cfg["use_sparse"],
            use_mm_prefix=False,
            use_per_head_quant_scales=False,
            device_capability=DeviceCapability(major, minor),
            attn_type="decoder",
        )


CASES = [
    # argv, expected exit code, backends that must be accepted (on CUDA), some exact refusals
    (
        GLM5_SM120,
        0,
        ["CUSTOM"],
        {
            "TRITON_MLA": ["sparse not supported"],
            "FLASHMLA_SPARSE": ["dtype not supported", "compute capability not supported"],
            "FLASHINFER_MLA_SPARSE": ["compute capability not supported"],
        },
    ),
    (
        ["--capability", "9.0", "--dtype", "bfloat16", "--sparse", "--block-size", "64"],
        0,
        ["FLASHMLA_SPARSE", "CUSTOM"],
        {"TRITON_MLA": ["sparse not supported"]},
    ),
    (
        ["--capability", "12.0", "--dtype", "float16"],  # dense MLA (DeepSeek-V3 style)
        0,
        ["TRITON_MLA"],
        {"CUSTOM": ["non-sparse not supported"]},
    ),
    (
        ["--capability", "12.0", "--no-mla", "--head-size", "128"],
        0,
        ["TRITON_ATTN", "FLEX_ATTENTION"],
        {
            "CUSTOM": [
                "head_size not supported",
                "non-MLA not supported",
                "non-sparse not supported",
            ]
        },
    ),
    (
        ["--capability", "8.0", "--dtype", "float16", "--sparse"],
        1,
        [],
        {"CUSTOM": ["compute capability not supported"]},
    ),
]


@pytest.mark.parametrize(("argv", "rc", "accepted", "refusals"), CASES)
def test_probe_json_matches_vllm_validation(argv, rc, accepted, refusals, capsys) -> None:
    code, report = _probe_json(argv, capsys)
    assert code == rc
    assert report["plugin"] == "registered"
    rows = {row["name"]: row for row in report["backends"]}
    for name in accepted:
        assert name in report["accepted_on_cuda"]
    assert (rc == 0) == bool(report["accepted_on_cuda"])
    for name, reasons in refusals.items():
        assert rows[name]["reasons"] == reasons
    # Every backend the probe could ask gives vLLM's own answer, word for word.
    asked = [row for row in rows.values() if row["reasons"][:1] not in (
        ["ImportError"], ["import failed"], ["validation failed"], ["not registered"])]  # fmt: skip
    assert len(asked) >= 15
    for row in asked:
        expected = _vllm_verdict(row["name"], report["capability"], report["config"])
        assert row["reasons"] == expected, row["name"]
        assert row["accepted"] == (expected == [])


def test_probe_table_for_glm5_on_sm120(capsys) -> None:
    assert probe_backends.main(GLM5_SM120) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("vLLM 0.23.0, compute capability 12.0, dtype=float16 head_size=576")
    assert lines[0].endswith("plugin vllm_sparse_mla: registered")
    rows = {line.split()[0]: line for line in lines[2:-2]}
    assert rows["CUSTOM"].split() == ["CUSTOM", "cuda", "yes", "yes", "-", "accepted"]
    assert rows["TRITON_MLA"].endswith("refused: sparse not supported")
    assert rows["FLASHMLA_SPARSE"].endswith(
        "refused: dtype not supported; compute capability not supported"
    )
    assert lines[-2] == "accepted on CUDA: CUSTOM"


def test_probe_exit_1_when_the_plugin_refuses_this_vllm(monkeypatch, capsys) -> None:
    import vllm_sparse_mla

    monkeypatch.setattr(vllm_sparse_mla, "_registered", False)
    monkeypatch.setattr(vllm_sparse_mla, "_VLLM_VERSION", "0.22.0")
    assert probe_backends.main(GLM5_SM120) == 1
    err = capsys.readouterr().err
    assert "error: vllm_sparse_mla refused to register: vLLM 0.23.0 is not the version" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--capability", "twelve"], "error: argument --capability: expected MAJOR.MINOR"),
        (["--dtype", "float8"], "error: argument --dtype: invalid choice"),
    ],
)
def test_probe_usage_errors_exit_2(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        probe_backends.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "platform"),
    [("ROCM_AITER_TRITON_MLA", "rocm"), ("ROCM_AITER_MLA_SPARSE", "rocm"),
     ("XPU_MLA_SPARSE", "xpu"), ("CPU_ATTN", "cpu"), ("TRITON_MLA", "cuda"), ("CUSTOM", "cuda")],
)  # fmt: skip
def test_probe_names_the_platform_of_each_backend(name, platform, capsys) -> None:
    _, report = _probe_json(GLM5_SM120, capsys)
    assert {row["name"]: row["platform"] for row in report["backends"]}[name] == platform
