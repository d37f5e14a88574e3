"""The official Python SDK's conformance "everything" server (``mcp_everything_server`` of the mcp source archive,
which ``scripts/setup.sh`` unpacks into ``.cache/mcp-everything-server``), served over stdio, Streamable HTTP or
HTTP+SSE, so the conformance suite can run against it directly and behind Bastion with each upstream transport.

Its own ``main`` serves only Streamable HTTP on a fixed port; this serves its ``mcp`` object unchanged, the way
that ``main`` does (its event store, a 100 ms retry interval) or the way ``MCPServer.run`` serves stdio and SSE:

    python tests/conformance/everything_server.py                                  # stdio
    python tests/conformance/everything_server.py --http 127.0.0.1:0               # Streamable HTTP at /mcp
    python tests/conformance/everything_server.py --http 127.0.0.1:0 --transport sse   # HTTP+SSE at /sse

Over HTTP the first line on stdout is the URL it serves (port 0 picks a free one).
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

import anyio

EVERYTHING_DIR = Path(__file__).resolve().parents[2] / ".cache" / "mcp-everything-server"


def missing() -> str | None:
    """Why the server cannot run here, or None."""
    if not (EVERYTHING_DIR / "mcp_everything_server" / "server.py").exists():
        return (f"{EVERYTHING_DIR} has no mcp_everything_server: run scripts/setup.sh (it unpacks the SDK's "
                "everything-server from the mcp source archive)")
    return None


def load():
    sys.path.insert(0, str(EVERYTHING_DIR))
    from mcp_everything_server import server

    return server


async def serve_http(server, listen: str, transport: str) -> None:
    import uvicorn

    host, _, port = listen.rpartition(":")
    listener = socket.create_server((host, int(port)))
    bound = listener.getsockname()[1]
    if transport == "sse":
        app, path = server.mcp.sse_app(host=host), "/sse"
    else:
        app = server.mcp.streamable_http_app(host=host, event_store=server.event_store, retry_interval=100)
        path = "/mcp"
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"http://{host}:{bound}{path}", flush=True)
    await uvicorn.Server(config).serve(sockets=[listener])


def main() -> None:
    parser = argparse.ArgumentParser(description="The SDK's conformance everything-server, on any transport.")
    parser.add_argument("--http", metavar="HOST:PORT", help="serve over HTTP instead of stdio (PORT 0: a free one)")
    parser.add_argument("--transport", choices=("streamable-http", "sse"), default="streamable-http")
    arguments = parser.parse_args()
    if reason := missing():
        raise SystemExit(reason)
    server = load()
    if arguments.http:
        anyio.run(serve_http, server, arguments.http, arguments.transport)
    else:
        anyio.run(server.mcp.run_stdio_async)


if __name__ == "__main__":
    main()
