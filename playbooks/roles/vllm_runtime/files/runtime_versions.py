"""Print the runtime venv's Python version and distribution versions as JSON (read-only)."""

import json
import platform
import sys
from importlib import metadata

names = sys.argv[1:]
versions = {}
for name in names:
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        versions[name] = None
print(json.dumps({"python": ".".join(platform.python_version_tuple()[:2]), "versions": versions}))
