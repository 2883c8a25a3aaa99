"""Serve vLLM's real OpenAI app (no engine) over loopback HTTP, for the route checker's test.

    python -m support.vllm_app_server KEY

Builds the app the way `vllm serve --api-key KEY` does (vLLM's own `make_arg_parser` and
`build_app(args, ("generate",))`, as tests/support/vllm_auth_probe.py does), with no engine
(`app.state.engine_client` None, vLLM's render-only case), and serves it with uvicorn on
127.0.0.1 at an ephemeral port; prints `port N` once it listens, then serves until killed.
PYTHONPATH picks the vllm/ it imports (a patched copy or the installed pristine one). The device
type is set to "cpu" only because vLLM's argument defaults ask the platform for one.
"""

from __future__ import annotations

import asyncio
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("error: usage: python -m support.vllm_app_server KEY", file=sys.stderr)
        return 2
    from vllm.platforms import current_platform

    current_platform.device_type = "cpu"

    import uvicorn
    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--api-key", argv[0]])
    app = build_app(args, ("generate",))
    app.state.engine_client = None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"port {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    asyncio.run(server.serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
