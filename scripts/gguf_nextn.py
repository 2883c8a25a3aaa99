"""Say whether a GLM-5 GGUF carries its MTP/nextn layer, which MTP speculative decoding drafts with.

llama.cpp's converter writes GLM-5's multi-token-prediction layer as the last block(s):
`<arch>.nextn_predict_layers` = n and `<arch>.block_count` = trunk + n, with tensors
blk.<i>.nextn.eh_proj.weight (and the layer's attention, indexer and MoE) for those blocks. vLLM's
`--speculative-config '{"method": "mtp", ...}'` (patch 0009) loads them into its MTP draft model;
a GGUF converted or re-packed without them cannot draft. Reads only the header (gguf-py's
GGUFReader memory-maps the file), so it takes milliseconds on a 400 GB file. Run with a python
that has gguf>=0.18 (the vLLM venv's); the vllm_service role runs it before it renders a unit
with speculative decoding on.

Exit: 0 the layer is there (one JSON line: arch, block_count, nextn_predict_layers,
nextn_blocks), 1 it is not (one `error:` line), 2 usage or an unreadable file.

Examples:
  /opt/glm5/venv/bin/python scripts/gguf_nextn.py /srv/glm5/GLM-5-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Nextn:
    arch: str
    block_count: int
    nextn_predict_layers: int
    nextn_blocks: list[int]  # the nextn blocks whose eh_proj tensor the file holds

    @property
    def complete(self) -> bool:
        """Every block the header announces as nextn has its tensors."""
        want = range(self.block_count - self.nextn_predict_layers, self.block_count)
        return self.nextn_predict_layers > 0 and self.nextn_blocks == list(want)


def _field(reader, key: str):
    field = reader.get_field(key)
    return None if field is None else field.contents()


def read_nextn(path: Path) -> Nextn:
    """The nextn facts of one GGUF file (a merged file or the shard holding the last blocks)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = str(_field(reader, "general.architecture") or "")
    blocks = int(_field(reader, f"{arch}.block_count") or 0)
    n = int(_field(reader, f"{arch}.nextn_predict_layers") or 0)
    found = sorted(
        int(t.name.split(".")[1])
        for t in reader.tensors
        if t.name.startswith("blk.") and t.name.endswith(".nextn.eh_proj.weight")
    )
    return Nextn(arch, blocks, n, found)


def message(path: Path, nx: Nextn) -> str:
    """The one-line refusal for a GGUF without (all of) its nextn layer."""
    return (
        f"error: {path} has no complete MTP/nextn layer ({nx.arch}.nextn_predict_layers="
        f"{nx.nextn_predict_layers}, nextn eh_proj tensors in blocks {nx.nextn_blocks} of "
        f"{nx.block_count}): MTP speculative decoding needs it; set "
        "vllm_service_speculative_tokens: 0 or use a GGUF converted with the nextn layer"
    )


def main(argv: list[str] | None = None) -> int:
    # Self-contained (no cli_args): Ansible's script module copies this one file to the host.
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Examples:\n" + __doc__.split("Examples:\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("gguf", type=Path, help="the GGUF file")
    args = p.parse_args(argv)
    try:
        nx = read_nextn(args.gguf)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args.gguf} as GGUF: {exc}", file=sys.stderr)
        return 2
    if not nx.complete:
        print(message(args.gguf, nx), file=sys.stderr)
        return 1
    print(json.dumps(asdict(nx)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
