#!/usr/bin/env python3
"""TCP reachability probe for the ray_cluster preflight; prints one JSON object, changes nothing.

listen:  bind ADDRESS:PORT for each --port and accept until every port has seen --expect
         connections or --timeout seconds pass. A port already in use (a running Ray node on
         a converged cluster) is reported as in_use and left to its owner, which answers instead.
connect: open a TCP connection to each --target NAME=HOST:PORT, retrying until --timeout;
         report the ones that never connected, each as 'NAME at HOST:PORT (last error)'.

Exit: 0 after a probe (the role reads the JSON and decides), 2 on bad arguments.
Example:
  ray_port_probe.py listen --address 10.0.0.2 --port 6380 --port 6381 --expect 2 --timeout 20
  ray_port_probe.py connect --target gpu01=10.0.0.1:6379 --timeout 20
"""

from __future__ import annotations

import argparse
import errno
import json
import selectors
import socket
import time


def listen(address: str, ports: list[int], expect: int, timeout: float) -> dict:
    sel = selectors.DefaultSelector()
    seen: dict[int, int] = {}
    in_use: list[int] = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            in_use.append(port)
            continue
        sock.listen(64)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, port)
        seen[port] = 0
    deadline = time.monotonic() + timeout
    while seen and min(seen.values()) < expect:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            conn, _peer = key.fileobj.accept()
            conn.close()
            seen[key.data] += 1
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return {"address": address, "accepted": seen, "in_use": in_use}


def connect(targets: list[str], timeout: float) -> dict:
    pending: dict[str, tuple[str, str, int]] = {}
    for target in targets:
        name, _, hostport = target.partition("=")
        host, _, port = hostport.rpartition(":")
        pending[target] = (name, host, int(port))
    errors: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for target, (_name, host, port) in list(pending.items()):
            try:
                with socket.create_connection((host, port), timeout=2):
                    pass
            except OSError as exc:
                errors[target] = exc.strerror or str(exc)
            else:
                del pending[target]
                errors.pop(target, None)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    failed = [
        f"{name} at {host}:{port} ({errors.get(target, 'timed out')})"
        for target, (name, host, port) in pending.items()
    ]
    return {"failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p_listen = sub.add_parser("listen", help="accept connections from peers")
    p_listen.add_argument("--address", required=True, help="address to bind")
    p_listen.add_argument("--port", type=int, action="append", default=[], help="TCP port")
    p_listen.add_argument("--expect", type=int, default=1, help="connections per port")
    p_listen.add_argument("--timeout", type=float, default=20.0, help="seconds")
    p_connect = sub.add_parser("connect", help="connect to peers")
    p_connect.add_argument("--target", action="append", default=[], help="NAME=HOST:PORT")
    p_connect.add_argument("--timeout", type=float, default=20.0, help="seconds")
    args = parser.parse_args(argv)
    if args.mode == "listen":
        result = listen(args.address, args.port, args.expect, args.timeout)
    else:
        result = connect(args.target, args.timeout)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
