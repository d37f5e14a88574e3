"""A remote MCP server (the official Python SDK, Streamable HTTP at /mcp) guarded as the MCP authorization
specification asks of a resource server: its Protected Resource Metadata at
``/.well-known/oauth-protected-resource/mcp`` naming ``--issuer``; a request without a valid token answered 401
with ``WWW-Authenticate: Bearer resource_metadata=...``; a token checked as an RS256 JWT of the issuer's JWKS, for
this server's URL (``aud``), not expired, with ``--scope`` in its scope (else 403 ``insufficient_scope``).

Run: ``python tests/credentials/guarded_server.py --issuer URL [--scope S]``; the first line on stdout is the URL.
Its tool ``whoami`` says whose token the request carried (its ``sub``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import socket
import time

import httpx2
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("guarded-fixture")
_subject: contextvars.ContextVar[str] = contextvars.ContextVar("subject", default="nobody")


@mcp.tool(description="Say whose token this request carried")
def whoami() -> str:
    return _subject.get()


class Guard:
    def __init__(self, app, issuer: str, url: str, scope: str) -> None:
        self.app, self.issuer, self.url, self.scope = app, issuer, url, scope
        self.metadata_url = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
        self.keys: KeySet | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/.well-known/oauth-protected-resource/mcp":
            await self._answer(send, 200, [(b"content-type", b"application/json")], json.dumps(
                {"resource": self.url, "authorization_servers": [self.issuer],
                 "scopes_supported": [self.scope]}).encode())
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        claims = await self.verified(headers.get("authorization"))
        if claims is None:
            challenge = f'Bearer resource_metadata="{self.metadata_url}", scope="{self.scope}"'
            await self._answer(send, 401, [(b"www-authenticate", challenge.encode())], b"")
            return
        if self.scope not in str(claims.get("scope", "")).split():
            challenge = f'Bearer error="insufficient_scope", scope="{self.scope}", resource_metadata="{self.metadata_url}"'
            await self._answer(send, 403, [(b"www-authenticate", challenge.encode())], b"")
            return
        _subject.set(str(claims.get("sub")))
        await self.app(scope, receive, send)

    async def verified(self, authorization: str | None) -> dict | None:
        if not authorization or not authorization.startswith("Bearer "):
            return None
        if self.keys is None:
            async with httpx2.AsyncClient(timeout=10) as http:
                self.keys = KeySet.import_key_set((await http.get(f"{self.issuer}/jwks")).json())
        try:
            claims = jwt.decode(authorization[len("Bearer "):], self.keys, algorithms=["RS256"]).claims
        except (JoseError, ValueError):
            return None
        audiences = claims.get("aud") if isinstance(claims.get("aud"), list) else [claims.get("aud")]
        if claims.get("iss") != self.issuer or self.url not in audiences or claims.get("exp", 0) <= time.time():
            return None
        return claims

    @staticmethod
    async def _answer(send, status: int, headers: list, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


async def serve(arguments: argparse.Namespace) -> None:
    import uvicorn

    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    app = Guard(mcp.streamable_http_app(host="127.0.0.1"), arguments.issuer, url, arguments.scope)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    print(url, flush=True)
    await server.serve(sockets=[listener])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--scope", default="mcp:tools")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
