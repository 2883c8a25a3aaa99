#!/usr/bin/env python3
"""List the alive nodes of a running Ray cluster as JSON; run with the venv's python on the head.

Connects as a driver (ray.init) to ADDRESS and prints
{"alive": [{"ip": ..., "resources": {...}}], "ray": VERSION}. Changes nothing in the cluster.
Exit: 0 connected, 1 no cluster at ADDRESS (message on stderr), 2 bad arguments.
Example:
  /opt/glm5/venv/bin/python ray_cluster_nodes.py --address 10.0.0.1:6379
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="GCS address of the head, HOST:PORT")
    args = parser.parse_args(argv)
    import ray

    try:
        ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:
        print(f"error: no Ray cluster at {args.address}: {exc}", file=sys.stderr)
        return 1
    try:
        alive = [
            {"ip": n["NodeManagerAddress"], "resources": n["Resources"]}
            for n in ray.nodes()
            if n["Alive"]
        ]
    finally:
        ray.shutdown()
    print(json.dumps({"alive": sorted(alive, key=lambda n: n["ip"]), "ray": ray.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
