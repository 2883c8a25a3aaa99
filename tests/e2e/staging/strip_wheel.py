"""Rewrite a wheel without members the H200 Triton/MLA path does not need, LZMA-compressed.

Adapted from the workplace's shared device-vllm recipe. pip reads LZMA zip members through
zipfile, so the rewritten wheel installs as usual. Dropped from the vLLM wheel:
  vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so   FlashAttention-2 (Ampere/Ada; Hopper uses FA3)
  vllm/vllm-rs                               Rust frontend binary (opt-in)
  vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so   other Python versions
RECORD lines of dropped members are removed too. Other wheels are only recompressed.

    python strip_wheel.py IN.whl OUT.whl
"""

from __future__ import annotations

import re
import sys
import zipfile

DROP = re.compile(
    r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$"
    r"|^vllm/vllm-rs$"
    r"|^vllm/third_party/deep_gemm/_C\.cpython-31[0134]-x86_64-linux-gnu\.so$"
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("error: usage: strip_wheel.py IN.whl OUT.whl", file=sys.stderr)
        return 2
    src, dst = argv
    comp = zipfile.ZIP_LZMA
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", compression=comp) as zo:
        for info in zi.infolist():
            if DROP.search(info.filename):
                print(f"dropped {info.filename} ({info.file_size / 2**20:.1f} MiB)")
                continue
            data = zi.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(x for x in lines if not DROP.search(x.split(",", 1)[0])).encode()
            ni = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            ni.external_attr = info.external_attr
            ni.compress_type = comp
            zo.writestr(ni, data, compress_type=comp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
