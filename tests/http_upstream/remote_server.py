"""A remote MCP server for the HTTP upstream tests, written with the official SDK (or FastMCP with --fastmcp).

Serves Streamable HTTP at /mcp (both eras: the SDK answers server/discover and initialize alike) or the old HTTP+SSE
transport at /sse, on 127.0.0.1 and a free port; the first line on stdout is the URL. Tools: ``echo``, ``headers``
(the request headers the server received, as JSON), ``ask`` (sampling: the client's model), ``slow`` (progress, then an answer after the seconds asked),
``grow`` (adds a tool and says the list changed). With REMOTE_EVENTS set, each HTTP request's method, path and
session id is appended to that file. A resource ``note://hello`` and a prompt ``greet``.
"""

import argparse
import asyncio
import json
import os
import socket

import uvicorn


from fastmcp import Context as FastContext, FastMCP
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from pydantic import Field
from mcp.types import CreateMessageResult, SamplingMessage, TextContent


def ask_llm(question: str) -> Sample:
    return Sample([SamplingMessage(role="user", content=TextContent(type="text", text=question))], max_tokens=50)


def build_sdk():

    server = MCPServer("remote-fixture")

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool()
    def headers(ctx: Context) -> str:
        """The HTTP request headers this call arrived with (and its HTTP version, as ``:http-version``)."""
        seen = {k.lower(): v for k, v in (ctx.headers or {}).items()}
        scope = getattr(ctx.request_context.request, "scope", None) or {}
        seen[":http-version"] = scope.get("http_version", "")
        return json.dumps(seen)

    @server.tool()
    async def slow(seconds: float, ctx: Context) -> str:
        """Report progress, then answer after the seconds asked."""
        await ctx.report_progress(1, 2, "halfway")
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add a tool named extra and say the list changed."""
        server.add_tool(lambda: "extra!", name="extra", description="Added by grow.")
        try:
            await ctx.notify_tools_changed()
        except Exception:  # noqa: BLE001 - a legacy session has no listen stream: tell it on the session
            pass
        try:
            await ctx.request_context.session.send_tool_list_changed()
        except Exception:  # noqa: BLE001 - a modern request has no session to tell
            pass
        return "grown"

    @server.tool()
    def regional(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
                 ctx: Context) -> str:
        """Answer for a region, which 2026-07-28 clients also send as the Mcp-Param-Region header."""
        return f"{region} (header: {(ctx.headers or {}).get('mcp-param-region')})"

    @server.tool()
    async def ask(question: str, answer: Annotated[CreateMessageResult, Resolve(ask_llm)]) -> str:
        """Ask the client's model (sampling) and say what it answered."""
        content = answer.content
        return f"the model said: {getattr(content, 'text', content)}"

    @server.resource("note://hello")
    def note() -> str:
        """A short note."""
        return "hello from the remote"

    @server.prompt()
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello, {name}!"

    return server


def build_fastmcp():

    server = FastMCP("remote-fastmcp")

    @server.tool
    def echo(text: str) -> str:
        """Say the text back."""
        return f"echo: {text}"

    @server.tool
    async def slow(seconds: float, ctx: FastContext) -> str:
        """Report progress, then answer after the seconds asked."""
        await ctx.report_progress(1, 2)
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.resource("note://hello")
    def note() -> str:
        return "hello from the remote"

    @server.prompt
    def greet(name: str) -> str:
        return f"Hello, {name}!"

    return server


def recording(app, path: str):
    """The app, with each HTTP request's method and path appended to the file ``path`` (what reached the server)."""

    async def recorded(scope, receive, send):
        if scope["type"] == "http":
            with open(path, "a", encoding="utf-8") as events:
                session = dict(scope.get("headers") or []).get(b"mcp-session-id", b"-").decode()
                events.write(f"{scope['method']} {scope['path']} {session}\n")
        await app(scope, receive, send)

    return recorded


def serve_tls(app, path: str, port: int, cert: str, key: str, alpn: list[str]) -> None:
    """HTTPS with ALPN offering h2 and http/1.1 (hypercorn), as a production server behind TLS does."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    listener = socket.create_server(("127.0.0.1", port))
    config = Config()
    config.certfile, config.keyfile = cert, key
    config.alpn_protocols = alpn
    config.loglevel = "WARNING"
    config.bind = [f"fd://{listener.fileno()}"]
    print(f"https://127.0.0.1:{listener.getsockname()[1]}{path}", flush=True)
    asyncio.run(serve(app, config))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=("streamable-http", "sse"), default="streamable-http")
    parser.add_argument("--json-response", action="store_true")
    parser.add_argument("--fastmcp", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve HTTPS (and HTTP/2) with hypercorn")
    parser.add_argument("--http1-only", action="store_true", help="with --tls: offer only http/1.1 by ALPN")
    arguments = parser.parse_args()
    if arguments.fastmcp:
        app = build_fastmcp().http_app(path="/mcp", transport="http", json_response=arguments.json_response)
        path = "/mcp"
    elif arguments.transport == "sse":
        app, path = build_sdk().sse_app(), "/sse"
    else:
        app = build_sdk().streamable_http_app(json_response=arguments.json_response)
        path = "/mcp"
    if os.environ.get("REMOTE_EVENTS"):
        app = recording(app, os.environ["REMOTE_EVENTS"])
    if arguments.tls:
        serve_tls(app, path, arguments.port, *arguments.tls,
                  alpn=["http/1.1"] if arguments.http1_only else ["h2", "http/1.1"])
        return
    listener = socket.create_server(("127.0.0.1", arguments.port))
    listener.set_inheritable(True)
    print(f"http://127.0.0.1:{listener.getsockname()[1]}{path}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    asyncio.run(server.serve(sockets=[listener]))


if __name__ == "__main__":
    main()
