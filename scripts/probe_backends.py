"""Ask vLLM's own attention backend classes for their verdict on one attention configuration.

Runs on a CPU-only machine with vLLM installed: every member of vLLM's AttentionBackendEnum (MLA
and non-MLA, CUSTOM included once a plugin registered it) is imported and asked
``validate_configuration(...)``, the method vLLM's CUDA platform uses to select a backend; the
table shows each verdict with vLLM's reasons, and which backend vLLM's automatic selection
(its CUDA priority list for that compute capability) would pick. Installed vLLM general plugins
are loaded first, as vLLM does; the repository's plugin ``vllm_sparse_mla`` is also registered
when it is importable without being installed.

Exit codes: 0 at least one CUDA backend accepts the configuration (ROCm/XPU/CPU backends that
pass vLLM's generic validation are shown but do not count); 1 none accepts, or the
vllm_sparse_mla plugin is present but refused to register (vLLM version mismatch); 2 usage error
(including no --capability on a machine without a visible GPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import cli_args

EXAMPLES = """examples:
  python scripts/probe_backends.py --capability 12.0 --dtype float16 --head-size 576 --sparse \\
      --kv-cache-dtype auto --block-size 64          # GLM-5 on SM120 (make probe)
  python scripts/probe_backends.py --capability 9.0 --dtype bfloat16 --sparse --json
  python scripts/probe_backends.py --capability 12.0 --no-mla --head-size 128
"""

DTYPES = ("float16", "bfloat16", "float32")
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")


@dataclass
class Verdict:
    """One backend's answer; ``reasons`` are vLLM's own strings (empty = accepted)."""

    name: str
    class_path: str | None
    accepted: bool
    reasons: list[str]
    is_mla: bool | None = None
    is_sparse: bool | None = None
    auto_priority: int | None = None  # index in vLLM's CUDA priority list, None = not in it
    detail: str | None = None  # why the class could not be imported or validated
    platform: str = "cuda"  # cuda | rocm | xpu | cpu, from the class path

    @property
    def usable_on_cuda(self) -> bool:
        return self.accepted and self.platform == "cuda"


@dataclass
class Report:
    vllm_version: str
    capability: str
    config: dict[str, Any]
    plugin: str  # registered | not installed | version mismatch
    backends: list[Verdict] = field(default_factory=list)
    auto_selected: str | None = None
    auto_known: bool = False  # False: vLLM's CUDA priority list could not be loaded (no driver)

    @property
    def accepted(self) -> list[str]:
        return [v.name for v in self.backends if v.accepted]

    @property
    def accepted_on_cuda(self) -> list[str]:
        return [v.name for v in self.backends if v.usable_on_cuda]


def _capability(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected MAJOR.MINOR such as 12.0, got {text!r}"
        ) from None
    return major, minor


def _load_plugins() -> str:
    """Load installed general plugins as vLLM does, then the repo's plugin if only importable."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    if importlib.util.find_spec("vllm_sparse_mla") is None:
        return "not installed"
    import vllm_sparse_mla

    return "registered" if vllm_sparse_mla.register() else "version mismatch"


def _auto_priorities(use_mla: bool, capability: Any, kv_cache_dtype: str) -> list[Any] | None:
    """vLLM's CUDA priority list for automatic selection; None where vllm.platforms.cuda cannot
    be imported (it loads vllm._C, which needs the NVIDIA driver's libcuda)."""
    try:
        from vllm.platforms.cuda import _get_backend_priorities
    except ImportError:
        return None
    return list(_get_backend_priorities(use_mla, capability, None, kv_cache_dtype))


def _platform(class_path: str | None) -> str:
    """Which vLLM platform a backend class is written for (ROCm/XPU/CPU backends can pass the
    generic validation but never run on CUDA)."""
    module = (class_path or "").rsplit(".", 1)[0].lower()
    if "rocm" in module or "aiter" in module:
        return "rocm"
    if "xpu" in module:
        return "xpu"
    return "cpu" if module.endswith("cpu_attn") else "cuda"


def probe(
    capability: tuple[int, int],
    dtype: str,
    head_size: int,
    use_mla: bool,
    use_sparse: bool,
    kv_cache_dtype: str,
    block_size: int | None,
) -> Report:
    """Run every backend's ``validate_configuration`` for one configuration."""
    import torch
    import vllm
    from vllm.config import CacheConfig, DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    plugin = _load_plugins()
    # Some backends read the current config while validating (FLASH_ATTN's block sizes).
    # The device is named, not detected: the probe asks about CUDA backends on any machine.
    vllm_config = VllmConfig(
        device_config=DeviceConfig(device="cuda"), cache_config=CacheConfig(block_size=block_size)
    )
    device_capability = DeviceCapability(*capability)
    config = AttentionSelectorConfig(
        head_size=head_size,
        dtype=getattr(torch, dtype),
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
        block_size=block_size,
        use_mla=use_mla,
        use_sparse=use_sparse,
    )
    priorities = _auto_priorities(use_mla, device_capability, kv_cache_dtype)
    report = Report(
        vllm_version=vllm.__version__,
        capability=f"{capability[0]}.{capability[1]}",
        config={
            "head_size": head_size,
            "dtype": dtype,
            "kv_cache_dtype": kv_cache_dtype,
            "block_size": block_size,
            "use_mla": use_mla,
            "use_sparse": use_sparse,
        },
        plugin=plugin,
        auto_known=priorities is not None,
    )
    for member in AttentionBackendEnum:
        priority = priorities.index(member) if priorities and member in priorities else None
        try:
            path = member.get_path()
        except ValueError:  # CUSTOM before any plugin registered it
            report.backends.append(Verdict(member.name, None, False, ["not registered"]))
            continue
        try:
            cls = member.get_class()
        except Exception as exc:  # a backend module that cannot load on this machine
            # vLLM's selector reports an ImportError as "ImportError" (and lets anything else,
            # such as FLASHINFER_MLA's CUDA allocation at import on a CPU-only machine, escape).
            reason = "ImportError" if isinstance(exc, ImportError) else "import failed"
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            report.backends.append(
                Verdict(member.name, path, False, [reason], None, None, priority, detail)
            )
            continue
        try:
            with set_current_vllm_config(vllm_config):
                reasons = cls.validate_configuration(
                    device_capability=device_capability, **config._asdict()
                )
        except Exception as exc:  # e.g. ROCm backends probe the GPU in supports_*()
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            report.backends.append(
                Verdict(
                    member.name, path, False, ["validation failed"], None, None, priority, detail
                )
            )
            continue
        report.backends.append(
            Verdict(
                member.name,
                path,
                not reasons,
                list(reasons),
                cls.is_mla(),
                cls.is_sparse(),
                priority,
            )
        )
    for v in report.backends:
        v.platform = _platform(v.class_path)
    valid = [v for v in report.backends if v.accepted and v.auto_priority is not None]
    if valid:
        report.auto_selected = min(valid, key=lambda v: v.auto_priority or 0).name
    return report


def _flag(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def render_table(report: Report) -> str:
    cfg = report.config
    lines = [
        f"vLLM {report.vllm_version}, compute capability {report.capability}, "
        f"dtype={cfg['dtype']} head_size={cfg['head_size']} use_mla={cfg['use_mla']} "
        f"use_sparse={cfg['use_sparse']} kv_cache_dtype={cfg['kv_cache_dtype']} "
        f"block_size={cfg['block_size']}; plugin vllm_sparse_mla: {report.plugin}",
        f"{'BACKEND':<28} {'PLATFORM':<9} {'MLA':<4} {'SPARSE':<7} {'AUTO':<5} VERDICT",
    ]
    for v in report.backends:
        auto = "-" if v.auto_priority is None else str(v.auto_priority)
        verdict = "accepted" if v.accepted else "refused: " + "; ".join(v.reasons)
        if v.detail:
            verdict += f" ({v.detail})"
        lines.append(
            f"{v.name:<28} {v.platform:<9} {_flag(v.is_mla):<4} {_flag(v.is_sparse):<7} "
            f"{auto:<5} {verdict}"
        )
    if report.auto_known:
        auto = report.auto_selected or "none (--attention-backend NAME is required)"
    else:
        auto = "unknown here (vllm.platforms.cuda needs the NVIDIA driver)"
    lines.append(f"accepted on CUDA: {', '.join(report.accepted_on_cuda) or 'none'}")
    lines.append(f"automatic selection: {auto}")
    return "\n".join(lines)


def _detect_capability() -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def main(argv: list[str] | None = None) -> int:
    p = cli_args.parser(__doc__, EXAMPLES)
    p.add_argument(
        "--capability",
        type=_capability,
        default=None,
        help="compute capability MAJOR.MINOR (default: %(default)s = the visible GPU's)",
    )
    p.add_argument("--dtype", choices=DTYPES, default="float16", help="model dtype (%(default)s)")
    p.add_argument("--head-size", type=int, default=576, help="head size (%(default)s)")
    p.add_argument("--sparse", action="store_true", help="sparse (DSA top-k) attention")
    p.add_argument("--no-mla", dest="mla", action="store_false", help="probe non-MLA attention")
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="kv-cache dtype (%(default)s)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="kv-cache block size as if given to vLLM with --block-size (default: %(default)s "
        "= not given, as vLLM's selector sees it then)",
    )
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="keep vLLM's log output")
    args = p.parse_args(argv)

    if not args.verbose:  # read by vLLM when it is first imported
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    capability = args.capability or _detect_capability()
    if capability is None:
        p.error("no GPU visible: pass --capability MAJOR.MINOR (e.g. 12.0)")

    report = probe(
        capability,
        args.dtype,
        args.head_size,
        args.mla,
        args.sparse,
        args.kv_cache_dtype,
        args.block_size,
    )
    if args.json:
        payload = asdict(report)
        payload["accepted"] = report.accepted
        payload["accepted_on_cuda"] = report.accepted_on_cuda
        print(json.dumps(payload, indent=2))
    else:
        print(render_table(report))
    if report.plugin == "version mismatch":
        print(
            f"error: vllm_sparse_mla refused to register: vLLM {report.vllm_version} is not "
            "the version it is pinned to (backend/pyproject.toml); install that vLLM",
            file=sys.stderr,
        )
        return 1
    if not report.accepted_on_cuda:
        print("error: no CUDA attention backend accepts this configuration", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
