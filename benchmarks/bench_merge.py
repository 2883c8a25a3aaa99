"""Benchmark scripts/gguf_merge.py against `cat` and llama-gguf-split on synthetic split sets.

Writes synthetic GLM-5-like sets (headers by gguf-py's GGUFWriter, a 154,880-token vocabulary in
shard 1, which holds no tensors, ~1,800 Q4_K tensors of random bytes in the other shards), then,
side by side with a warm page cache and the median of --repeat runs:
  - wall time of `cat shards > out`, `llama-gguf-split --merge` and gguf_merge.py on the --speed
    set; each run ends with the output fsynced (gguf_merge.py fsyncs itself; for the other two the
    benchmark fsyncs right after they exit, inside the timing), so the three do the same work;
  - peak RSS of each tool, from getrusage(RUSAGE_CHILDREN) in a small parent process;
  - peak RSS of gguf_merge.py on every --sizes set;
  - header validation time of the 10 shards: gguf_format (struct parser) vs gguf-py's GGUFReader.
Everything it writes lives under --dir and is removed at the end.

Run through `make bench-merge` or with PYTHONPATH=scripts:tests (it imports scripts/gguf_format.py
and tests/support/llama_cpp.py):

    python benchmarks/bench_merge.py                  # 1, 4 and 8 GB sets (~20 GB free in /tmp)
    python benchmarks/bench_merge.py --dir /dev/shm --sizes 1   # the tools, not the disk
    python benchmarks/bench_merge.py --speed 0 --sizes 8        # peak RSS only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf_format
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gguf_merge.py"

Q4_K = GGMLQuantizationType.Q4_K
ROW = 6144  # GLM-5 hidden size
ROW_BYTES = ROW // GGML_QUANT_SIZES[Q4_K][0] * GGML_QUANT_SIZES[Q4_K][1]
N_SHARDS = 10
N_TENSORS = 1800
VOCAB = 154880
BLOCK = 16 << 20
_RUNNER = (
    "import os, resource, subprocess, sys, time\n"
    "out = sys.argv[1]; t = time.perf_counter()\n"
    "subprocess.run(sys.argv[2:], check=True, stdout=subprocess.DEVNULL)\n"
    "if out != '-':\n"
    "    fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)\n"
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def write_set(directory: Path, total_bytes: int, rnd: bytes) -> list[Path]:
    """A 10-shard set of about total_bytes: shard 1 metadata only, ~200 tensors in each other."""
    directory.mkdir(parents=True)
    per_shard = N_TENSORS // (N_SHARDS - 1)
    rows_total = total_bytes // ROW_BYTES
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.2, 1.8, size=N_TENSORS)  # uneven tensor sizes, like a real model
    rows = np.maximum(1, (weights / weights.sum() * rows_total).astype(int))
    paths = []
    pos = 0
    for i in range(N_SHARDS):
        path = directory / f"GLM-5-bench-{i + 1:05d}-of-{N_SHARDS:05d}.gguf"
        w = GGUFWriter(path, "glm-dsa")
        w.kv_data[0].clear()
        if i == 0:
            _metadata(w)
        w.add_uint16("split.no", i)
        w.add_int32("split.tensors.count", N_TENSORS)
        w.add_uint16("split.count", N_SHARDS)
        sizes = []
        if i:
            first = (i - 1) * per_shard
            for j in range(first, first + per_shard):
                r = int(rows[j])
                w.add_tensor_info(f"blk.{j // 20}.t{j % 20}.weight", (r, ROW_BYTES), np.uint8,
                                  r * ROW_BYTES, raw_dtype=Q4_K)  # fmt: skip
                sizes.append(r * ROW_BYTES)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        fout = w.fout[0]
        w.write_padding(fout, fout.tell())
        for n in sizes:
            left = n
            while left:
                k = min(left, BLOCK - pos)
                fout.write(rnd[pos : pos + k])
                pos = (pos + k) % BLOCK
                left -= k
            w.write_padding(fout, n)
        w.close()
        paths.append(path)
    return paths


def _metadata(w: GGUFWriter) -> None:
    w.add_string("general.architecture", "glm-dsa")
    w.add_string("general.name", "GLM 5 (benchmark)")
    w.add_uint32("glm-dsa.block_count", 79)
    w.add_uint32("glm-dsa.attention.indexer.top_k", 2048)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_key_value(
        "tokenizer.ggml.tokens", [f"tok{i}" for i in range(VOCAB)], GGUFValueType.ARRAY,
        GGUFValueType.STRING,
    )  # fmt: skip
    w.add_key_value(
        "tokenizer.ggml.token_type", [1] * VOCAB, GGUFValueType.ARRAY, GGUFValueType.INT32
    )
    w.add_key_value(
        "tokenizer.ggml.merges", [f"a{i} b{i}" for i in range(321_000)], GGUFValueType.ARRAY,
        GGUFValueType.STRING,
    )  # fmt: skip


def run(cmd: list[str], out: Path | None) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of cmd, the output fsynced inside the timing."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(out) if out else "-", *cmd],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    secs, rss = proc.stdout.split()
    return float(secs), int(rss)


def _settle(out: Path | None) -> None:
    if out is not None:
        out.unlink(missing_ok=True)
    os.sync()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=None, help="scratch directory (default: under /tmp)")
    p.add_argument("--sizes", default="1,8", help="more set sizes in GB for peak RSS (%(default)s)")
    p.add_argument(
        "--speed", type=float, default=4, help="set size in GB timed, 0: none (%(default)s)"
    )
    p.add_argument("--repeat", type=int, default=3, help="timed runs per tool (%(default)s)")
    p.add_argument("--llama", type=Path, default=None, help="llama-gguf-split (default: built)")
    p.add_argument(
        "--reader",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time gguf-py's GGUFReader on the headers (slow: about a minute) (%(default)s)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)

    sizes = sorted({float(s) for s in args.sizes.split(",") if float(s)} | {args.speed} - {0.0})
    llama = args.llama
    if llama is None and args.speed:
        from support.llama_cpp import gguf_split_binary

        llama = gguf_split_binary()
    base = Path(tempfile.mkdtemp(prefix="bench-merge-", dir=args.dir))
    results: dict[str, object] = {"speed_set_gb": args.speed, "repeat": args.repeat}
    rnd = os.urandom(BLOCK)
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.1f} at the start; scratch {base}")
    results["load_average_start"] = load
    try:
        for size in sizes:
            need = 2.2 * size * 1e9
            free = shutil.disk_usage(base).free
            if free < need:
                print(f"skip {size:g} GB: {free / 1e9:.0f} GB free, need {need / 1e9:.0f} GB")
                continue
            t = time.perf_counter()
            shards = write_set(base / f"set{size:g}", int(size * 1e9), rnd)
            total = sum(s.stat().st_size for s in shards)
            print(f"set {size:g} GB: {total / 1e9:.2f} GB in {len(shards)} shards, written in "
                  f"{time.perf_counter() - t:.1f} s")  # fmt: skip
            out = base / "out.gguf"
            run(["cat", *map(str, shards)], None)  # warm the page cache
            _settle(None)
            if size == args.speed:
                results.update(_speed(shards, out, llama, args.repeat, total))
                results.update(_headers(shards, args.reader))
            else:
                _settle(out)
                secs, rss = run([sys.executable, str(SCRIPT), "--no-progress",
                                 str(shards[0]), str(out)], out)  # fmt: skip
                results[f"ours_{size:g}gb"] = {"seconds": secs, "peak_rss_mb": rss / 1024}
                print(f"  gguf_merge.py: {secs:.2f} s, peak RSS {rss / 1024:.0f} MB")
            _settle(out)
            shutil.rmtree(base / f"set{size:g}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["load_average_end"] = os.getloadavg()[0]
    print(f"load average {results['load_average_end']:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _speed(shards: list[Path], out: Path, llama: Path, repeat: int, total: int) -> dict:
    tools = {
        "cat": (
            ["sh", "-c", 'out="$1"; shift; cat "$@" > "$out"', "sh", str(out), *map(str, shards)]
        ),
        "llama-gguf-split": [str(llama), "--merge", str(shards[0]), str(out)],
        "gguf_merge.py": [sys.executable, str(SCRIPT), "--no-progress", str(shards[0]), str(out)],
    }
    times: dict[str, list[float]] = {k: [] for k in tools}
    rss: dict[str, int] = dict.fromkeys(tools, 0)
    for _ in range(repeat):
        for name, cmd in tools.items():  # interleaved, so drift hits every tool alike
            _settle(out)
            secs, kb = run(cmd, out)
            times[name].append(secs)
            rss[name] = max(rss[name], kb)
    _settle(out)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  merge speed, {total / 1e9:.2f} GB, warm cache, output fsynced, median of {repeat}:")
    print(f"  {'tool':<18}{'median s':>9}{'GB/s':>7}{'vs cat':>8}{'peak RSS':>10}   runs")
    rows = {}
    for name in tools:
        ratio = med["cat"] / med[name]
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"  {name:<18}{med[name]:>9.2f}{total / med[name] / 1e9:>7.2f}{ratio:>7.2f}x"
              f"{rss[name] / 1024:>7.0f} MB   {runs}")  # fmt: skip
        rows[name] = {"median_s": med[name], "runs_s": times[name], "vs_cat": ratio,
                      "peak_rss_mb": rss[name] / 1024}  # fmt: skip
    vs_llama = med["llama-gguf-split"] / med["gguf_merge.py"]
    print(f"  gguf_merge.py vs llama-gguf-split: {vs_llama:.2f}x")
    return {"speed": rows}


def _headers(shards: list[Path], with_reader: bool) -> dict:
    ours = []
    for _ in range(3):
        t = time.perf_counter()
        plan = gguf_format.plan_merge(gguf_format.read_set(shards))
        ours.append(time.perf_counter() - t)
    med = statistics.median(ours)
    if not with_reader:
        print(f"  header validation, {len(shards)} shards, {plan.n_tensors} tensors, {VOCAB} "
              f"tokens: gguf_split {med:.3f} s (median of 3)")  # fmt: skip
        return {"headers": {"gguf_split_s": med, "tensors": plan.n_tensors}}
    t = time.perf_counter()
    n = sum(len(GGUFReader(s).tensors) for s in shards)
    reader = time.perf_counter() - t
    assert n == plan.n_tensors
    print(f"  header validation, {len(shards)} shards, {plan.n_tensors} tensors, {VOCAB} tokens: "
          f"gguf_split {med:.3f} s (median of 3), "
          f"gguf-py GGUFReader {reader:.2f} s ({reader / med:.0f}x slower)")  # fmt: skip
    return {"headers": {"gguf_split_s": med, "gguf_reader_s": reader,
                        "tensors": plan.n_tensors}}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
