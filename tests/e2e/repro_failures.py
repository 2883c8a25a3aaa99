"""Reproduce the three original GLM-5 GGUF failures on pristine vLLM 0.23.0; record the messages.

Run on the GPU machine with the staged, UNPATCHED vLLM (pipeline.sh reverts the series first).
One process, engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so each failure is the
exception vLLM itself raises, with its traceback. Cases, in order:

  speculators   LLM(<merged.gguf>, hf_config_path=<HF dir>, tokenizer=<HF dir>, dtype=float16):
                maybe_override_with_speculators hands the GGUF to transformers, which refuses
                architecture glm-dsa (DESIGN.md failure 1). Real.
  dtype_cc9     EngineArgs(<merged.gguf>, dtype=bfloat16).create_engine_config() on this GPU.
                GGUF's dtype check refuses bf16 only on compute capability >= 10.0
                (GGUFConfig.get_supported_act_dtypes), so on the H200 (9.0) it is expected to
                PASS; recorded as a fact. The speculators call is bypassed (simulated patch 1).
  dtype_cc12    The same with the platform's capability simulated as 12.0 (the Blackwell
                workstation): vLLM's own check raises "torch.bfloat16 is not supported for
                quantization method gguf" (failure 2). Simulated capability, real vLLM code.
  backend       LLM(<HF dir>, load_format=dummy, dtype=float16): no attention backend accepts
                MLA + sparse in fp16 (failure 3). Real (FLASHMLA_SPARSE is bf16-only, the other
                MLA backends reject sparse).

Exit: 0 when every expected failure was reproduced (and dtype_cc9 behaved as expected), 1 if
not, 2 on usage errors.

    PYTHONPATH=tests python -m e2e.repro_failures --gguf M.gguf --hf-dir CKPT --json failures.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from support import cli

EXAMPLES = """examples:
  PYTHONPATH=tests python -m e2e.repro_failures --gguf /tmp/e2e/tiny-glm5-Q8_0.gguf \\
      --hf-dir /tmp/e2e/ckpt --json out/failures.json --log-dir /tmp/e2e/logs
  PYTHONPATH=tests python -m e2e.repro_failures --gguf M.gguf --hf-dir CKPT --case speculators
"""

CASES = ("speculators", "dtype_cc9", "dtype_cc12", "backend")
EXPECTED = {
    "speculators": "glm-dsa",
    "dtype_cc9": None,  # no error expected on compute capability 9.0
    "dtype_cc12": "is not supported for quantization method gguf",
    "backend": "No valid attention backend found",
}
SIMULATED = {
    "speculators": None,
    "dtype_cc9": "maybe_override_with_speculators bypassed (what patch 1 does)",
    "dtype_cc12": "maybe_override_with_speculators bypassed; device capability reported as 12.0",
    "backend": None,
}


@contextlib.contextmanager
def speculators_bypassed() -> Iterator[None]:
    import vllm.engine.arg_utils as arg_utils

    saved = arg_utils.maybe_override_with_speculators

    def passthrough(model, tokenizer, trust_remote_code, revision=None, **kwargs):  # noqa: ANN001
        return model, tokenizer, kwargs.get("vllm_speculative_config")

    arg_utils.maybe_override_with_speculators = passthrough
    try:
        yield
    finally:
        arg_utils.maybe_override_with_speculators = saved


@contextlib.contextmanager
def capability(major: int, minor: int) -> Iterator[None]:
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    cls = type(current_platform)
    own = "get_device_capability" in cls.__dict__
    saved = cls.__dict__.get("get_device_capability")

    def fake(_cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(major, minor)

    cls.get_device_capability = classmethod(fake)
    try:
        yield
    finally:
        if own:
            cls.get_device_capability = saved
        else:
            del cls.get_device_capability


def engine_args(args: argparse.Namespace, dtype: str):  # noqa: ANN201
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(args.gguf),
        hf_config_path=str(args.hf_dir),
        tokenizer=str(args.hf_dir),
        dtype=dtype,
        max_model_len=1024,
        enforce_eager=True,
    )


def case_speculators(args: argparse.Namespace) -> None:
    from vllm import LLM

    LLM(
        model=str(args.gguf),
        hf_config_path=str(args.hf_dir),
        tokenizer=str(args.hf_dir),
        dtype="float16",
        max_model_len=1024,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
    )


def case_dtype_cc9(args: argparse.Namespace) -> None:
    with speculators_bypassed():
        engine_args(args, "bfloat16").create_engine_config()


def case_dtype_cc12(args: argparse.Namespace) -> None:
    with speculators_bypassed(), capability(12, 0):
        engine_args(args, "bfloat16").create_engine_config()


def case_backend(args: argparse.Namespace) -> None:
    from vllm import LLM

    LLM(
        model=str(args.hf_dir),
        load_format="dummy",
        dtype="float16",
        max_model_len=1024,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_num_seqs=8,
    )


RUNNERS: dict[str, Callable[[argparse.Namespace], None]] = {
    "speculators": case_speculators,
    "dtype_cc9": case_dtype_cc9,
    "dtype_cc12": case_dtype_cc12,
    "backend": case_backend,
}


def innermost(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""


def run_case(name: str, args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    rec: dict = {"name": name, "expected": EXPECTED[name], "simulated": SIMULATED[name]}
    try:
        RUNNERS[name](args)
    except BaseException as exc:  # noqa: BLE001  (the point is to record whatever vLLM raises)
        if isinstance(exc, KeyboardInterrupt):
            raise
        # the message of the root cause: engine start-up wraps errors in RuntimeError
        root = exc
        while root.__cause__ is not None:
            root = root.__cause__
        message = str(exc) if EXPECTED[name] and EXPECTED[name] in str(exc) else str(root)
        rec |= {
            "error_type": type(root).__name__,
            "message": message[:4000],
            "where": innermost(root),
        }
        if args.log_dir:
            text = "".join(traceback.format_exception(exc))
            (args.log_dir / f"repro_{name}.txt").write_text(text)
    else:
        rec |= {"error_type": None, "message": None, "where": None}
    rec["seconds"] = round(time.monotonic() - t0, 1)
    exp = EXPECTED[name]
    rec["as_expected"] = (rec["message"] is None) if exp is None else exp in (rec["message"] or "")
    status = "as expected" if rec["as_expected"] else "NOT as expected"
    print(f"REPRO {name}: {status} ({rec['seconds']} s): {rec['error_type']}: {rec['message']}")
    return rec


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python -m e2e.repro_failures")
    p.add_argument("--gguf", type=Path, required=True, help="the merged glm-dsa GGUF")
    p.add_argument("--hf-dir", type=Path, required=True, help="the HF checkpoint folder")
    p.add_argument("--json", type=Path, help="write the records here")
    p.add_argument("--log-dir", type=Path, help="write each full traceback here")
    p.add_argument(
        "--case",
        action="append",
        choices=CASES,
        help="run only this case (repeatable; default: all, in order %(choices)s)",
    )
    args = p.parse_args(argv)
    for path in (args.gguf, args.hf_dir):
        if not path.exists():
            p.error(f"{path} does not exist")
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.monotonic()
    import torch
    import vllm

    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    print(f"REPRO vllm {vllm.__version__} from {vllm.__file__}, capability {cap}")
    records = [run_case(name, args) for name in (args.case or CASES)]
    report = {
        "vllm_version": vllm.__version__,
        "vllm_file": vllm.__file__,
        "capability": list(cap) if cap else None,
        "seconds": round(time.monotonic() - t0, 1),
        "cases": records,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["as_expected"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
