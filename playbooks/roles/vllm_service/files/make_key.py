"""Write VLLM_API_KEY=<random> to a new 0600 file; never prints the key. Exit 0 ok, 1 exists."""

import os
import secrets
import sys

path = sys.argv[1]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
with os.fdopen(fd, "w") as f:
    f.write(f"VLLM_API_KEY={secrets.token_urlsafe(32)}\n")
