"""Fetch config and tokenizer files (never weights) of a hub repo. Exit 0 ok, 1 error."""

import sys
from pathlib import Path

from huggingface_hub import snapshot_download

repo, revision, dest, *patterns = sys.argv[1:]
try:
    snapshot_download(repo, revision=revision, local_dir=dest, allow_patterns=patterns)
except Exception as exc:  # report one line; the role fails with it
    print(f"error: {repo}@{revision}: {exc}", file=sys.stderr)
    sys.exit(1)
if not (Path(dest) / "config.json").is_file():
    print(f"error: {repo}@{revision} has no config.json", file=sys.stderr)
    sys.exit(1)
