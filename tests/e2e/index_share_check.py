"""GLM-5.2 (IndexShare) on the running server: layer indices and the outputs a reference checks.

The pipeline's `indexshare` step (tests/e2e/pipeline.sh, GENERATION=5.2) runs it on the GPU
machine against the server it started with the plugin's debug dump on
(VLLM_SPARSE_MLA_DUMP_TOPK=DUMP_DIR:N, backend/src/vllm_sparse_mla/debug_dump.py):

    PYTHONPATH=/tmp/site:tests python3 -m e2e.index_share_check --base-url http://127.0.0.1:8000 \\
        --api-key-file /tmp/e2e/api_key --model glm5-tiny --hf-dir /tmp/e2e/ckpt \\
        --dump-dir /tmp/e2e/topk --tokens 301 --json OUT/index_share.json \\
        --capture OUT/capture.json --topk-out OUT/topk.pt

1. Prompt 0 (exactly --tokens random token ids, more than index_topk, so the indexer really
   selects) is sent alone; its prefill is the one forward of that many tokens, and the dump holds
   the top-k rows every layer's attention read for it.
2. Checks on those rows, with the layer types from the HF config.json's indexer_types: each
   "shared" layer's rows equal the last "full" layer's before it (the first shared layer's
   indices equal the last full layer's); consecutive full layers differ (so the equality is no
   accident of a prompt short enough that every key is selected).
3. Prompts 1.. (other lengths, so they dump nothing) and prompt 0 are all recorded greedy with
   prompt logprobs and the sampled tokens' top logprobs (--capture): the input of the reference
   comparison against an independent forward of the same weights.

Only loopback addresses are contacted; every request has --timeout. Exit: 0 checks passed; 1 a
check failed or a request failed (one error line); 2 usage.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from support import cli

from e2e.route_check import CheckError, Client, loopback_url

EXAMPLES = """example:
  python3 -m e2e.index_share_check --base-url http://127.0.0.1:8000 --api-key-file KEY \\
      --model glm5-tiny --hf-dir CKPT --dump-dir /tmp/e2e/topk --tokens 301 --json out.json
"""
FIRST_ID = 16  # past the tokenizer's special tokens (tests/support/tiny_glm5.py SPECIAL_TOKENS)


def prompts(n: int, tokens: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompt i has tokens + 10 * i random ids in [FIRST_ID, vocab): only prompt 0 is dumped."""
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, vocab) for _ in range(tokens + 10 * i)] for i in range(n)]


def layer_index(name: str) -> int | None:
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def compare(rows: dict[int, Any], types: list[str]) -> dict[str, Any]:
    """The IndexShare checks on {layer: [N, topk] tensor} (see the module docstring)."""
    import torch

    missing = [i for i in range(len(types)) if i not in rows]
    shared, full_pairs = [], []
    last_full = None
    for i, t in enumerate(types):
        if i in missing:
            continue
        if t == "shared":
            same = last_full is not None and torch.equal(rows[i], rows[last_full])
            shared.append({"shared": i, "full": last_full, "equal": bool(same)})
        else:
            if last_full is not None:
                a, b = rows[last_full], rows[i]
                differ = int((a.sort(dim=1).values != b.sort(dim=1).values).any(dim=1).sum())
                full_pairs.append({"full": [last_full, i], "rows_differ": differ})
            last_full = i
    sample = rows[min(rows)] if rows else None
    selected = int((sample[-1] >= 0).sum()) if sample is not None else 0
    return {
        "layer_types": types,
        "missing_layers": missing,
        "rows": int(sample.shape[0]) if sample is not None else 0,
        "topk": int(sample.shape[1]) if sample is not None else 0,
        "last_row_selected": selected,
        "shared_equal_last_full": shared,
        "full_layers_differ": full_pairs,
        "passed": bool(
            not missing
            and shared
            and all(s["equal"] for s in shared)
            and full_pairs
            and all(p["rows_differ"] > 0 for p in full_pairs)
        ),
    }


def completion(client: Client, key: str, model: str, ids: list[int], args: Any) -> dict:
    body = {
        "model": model, "prompt": ids, "max_tokens": args.max_tokens, "temperature": 0.0,
        "logprobs": 5, "prompt_logprobs": 5, "ignore_eos": True, "return_token_ids": True,
    }  # fmt: skip
    status, data = client.post_json("/v1/completions", key, body)
    if status != 200:
        raise CheckError(f"POST /v1/completions answered {status}: {data[:300]!r}")
    choice = json.loads(data)["choices"][0]
    return {
        "prompt": ids,
        "token_ids": choice.get("token_ids"),
        "text": choice.get("text"),
        "logprobs": choice.get("logprobs"),
        "prompt_logprobs": choice.get("prompt_logprobs"),
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, EXAMPLES, prog="python3 -m e2e.index_share_check")
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key-file", type=Path, required=True)
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--hf-dir", type=Path, required=True, help="the HF dir (config.json)")
    p.add_argument("--dump-dir", type=Path, required=True, help="the server's dump DIR")
    p.add_argument("--tokens", type=int, default=301, help="prompt 0's length (the dump's N)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--deadline", type=float, default=180.0)
    p.add_argument("--json", type=Path, required=True, help="the verdict (index_share.json)")
    p.add_argument("--capture", type=Path, help="prompts, tokens, logprobs (capture.json)")
    p.add_argument("--topk-out", type=Path, help="save every layer's rows here (torch.save)")
    args = p.parse_args(argv)
    url = loopback_url(args.base_url)
    if url is None:
        return 2
    if args.prompts < 1 or args.tokens < 2:
        print("error: --prompts and --tokens must be positive", file=sys.stderr)
        return 2
    try:
        import torch  # the staged one on the GPU machine; only this step needs it

        cfg = json.loads((args.hf_dir / "config.json").read_text())
        types = cfg.get("indexer_types") or []
        if "shared" not in types:
            raise CheckError(f"{args.hf_dir}/config.json has no shared indexer layer")
        if args.tokens <= cfg["index_topk"]:
            raise CheckError(f"--tokens {args.tokens} must exceed index_topk {cfg['index_topk']}")
        key = args.api_key_file.read_text().strip()
        client = Client(url.hostname, url.port, args.timeout, time.monotonic() + args.deadline)
        # the toy tokenizer's trained ids (its BPE learns fewer than vocab_size)
        tok = json.loads((args.hf_dir / "tokenizer.json").read_text())
        vocab = min(cfg["vocab_size"], len(tok["model"]["vocab"]))
        ps = prompts(args.prompts, args.tokens, vocab)
        runs = [completion(client, key, args.model, ps[0], args)]
        rows = {}
        for f in sorted(args.dump_dir.glob("*.pt")):
            if (i := layer_index(f.name)) is not None:
                rows[i] = torch.load(f)
        verdict = compare(rows, types)
        if args.topk_out:
            torch.save({f"layer{i}": t for i, t in sorted(rows.items())}, args.topk_out)
        runs += [completion(client, key, args.model, ids, args) for ids in ps[1:]]
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    verdict["dump_files"] = sorted(f.name for f in args.dump_dir.glob("*.pt"))
    args.json.write_text(json.dumps(verdict, indent=2) + "\n")
    if args.capture:
        capture = {"model": args.model, "hf_config": cfg, "max_tokens": args.max_tokens}
        args.capture.write_text(json.dumps(capture | {"runs": runs}) + "\n")
    print(json.dumps({k: v for k, v in verdict.items() if k != "layer_types"}))
    if not verdict["passed"]:
        print("error: IndexShare check failed: " + json.dumps(verdict["shared_equal_last_full"]),
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
