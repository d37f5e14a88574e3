"""Where the user's browser comes back after authorizing Bastion: ``/oauth/callback?code=...&state=...&iss=...``.

``Callbacks`` keeps the authorizations under way by their one-time ``state`` and is an ASGI app: ``bastion serve
--http`` mounts it at ``/oauth/callback`` of its frontend (unauthenticated: the state is the proof, and it is
used once), and ``bastion run`` on stdio, which has no HTTP server of its own, opens a ``LoopbackListener`` on
127.0.0.1 for it the first time an authorization is asked for (RFC 8252: a native client's loopback redirect).

The page the browser is shown says whether it worked and nothing else: never a code, a token or a state.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

log = logging.getLogger("bastion.credentials")

CALLBACK_PATH = "/oauth/callback"
PENDING_LIFETIME = 600.0  # seconds an authorization link stays good; a person following it later gets a new one
_MAX_PENDING = 1000  # states kept at once; the oldest is forgotten first, so no caller can fill memory with links
# The callback listener serves browsers coming back from an authorization server: a redirect is one small GET.
CALLBACK_HEADER_TIMEOUT = 10.0
CALLBACK_CONNECTIONS = 64
CALLBACK_HEADER_BYTES = 32 * 1024

# Called with the callback's query parameters (code, iss, error, ...); returns what to tell the person, or raises
# CallbackRefused with the reason.
Completion = Callable[[Mapping[str, str]], Awaitable[str]]


class CallbackRefused(Exception):
    """The redirect cannot complete the authorization; the message is shown to the person."""


class Callbacks:
    """The authorizations waiting for their redirect, by state, and the ASGI app that completes them."""

    def __init__(self, redirect_uri: str | None = None) -> None:
        self.redirect_uri = redirect_uri  # set by the frontend that serves this app, or by a loopback listener
        self._pending: dict[str, tuple[float, Completion]] = {}

    def expect(self, state: str, completion: Completion) -> None:
        self._forget_expired()
        while len(self._pending) >= _MAX_PENDING:
            self._pending.pop(next(iter(self._pending)))
        self._pending[state] = (time.monotonic() + PENDING_LIFETIME, completion)

    def forget(self, state: str) -> None:
        self._pending.pop(state, None)

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for state in [state for state, (deadline, _) in self._pending.items() if deadline < now]:
            del self._pending[state]

    async def complete(self, params: Mapping[str, str]) -> tuple[int, str]:
        """(HTTP status, message for the person) for one redirect."""
        self._forget_expired()
        state = params.get("state", "")
        entry = self._pending.pop(state, None)  # one use, whatever the outcome
        if entry is None:
            return 400, "This authorization link is unknown or has already been used. Ask for the request again."
        try:
            return 200, await entry[1](params)
        except CallbackRefused as exc:
            log.warning("an authorization redirect was refused: %s", exc)
            return 400, f"Bastion refused this authorization: {exc}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope.get("method") != "GET" or scope.get("path") != CALLBACK_PATH:
            await _page(send, 404, "Not found.")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        params = {key: values[0] for key, values in query.items() if len(values) == 1}
        status, message = await self.complete(params)
        await _page(send, status, message)


async def _page(send: Any, status: int, message: str) -> None:
    body = (f"<!doctype html><meta charset=utf-8><title>Bastion</title><p>{html.escape(message)}</p>").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def callback_bounds() -> Any:
    """The callback listener's connection bounds: a browser sends one redirect, so any local process that opens
    connections and sends nothing (or too much) is cut off quickly, and cannot hold the gateway's descriptors."""
    from bastion.transport.listener import ConnectionBounds, raw_response

    def answer(status: int, reason: str, text: str) -> bytes:
        return raw_response(status, reason, text.encode(), b"text/plain; charset=utf-8")

    return ConnectionBounds(
        header_timeout=CALLBACK_HEADER_TIMEOUT, max_connections=CALLBACK_CONNECTIONS,
        max_per_address=CALLBACK_CONNECTIONS, max_header_bytes=CALLBACK_HEADER_BYTES,
        late_answer=answer(408, "Request Timeout", "the request did not arrive in time"),
        too_large_answer=answer(431, "Request Header Fields Too Large", "the request's headers are too large"),
        full_answer=answer(503, "Service Unavailable", "too many connections"),
        address_full_answer=answer(503, "Service Unavailable", "too many connections"))


class LoopbackListener:
    """An HTTP listener on 127.0.0.1 serving ``callbacks``, opened on first use; its port is chosen by the system
    unless ``port`` is given (a client registered in advance with a fixed redirect URI)."""

    def __init__(self, callbacks: Callbacks, port: int = 0) -> None:
        self._callbacks = callbacks
        self._port = port
        self._opening = asyncio.Lock()
        self._server: Any = None
        self._serving: asyncio.Task[None] | None = None

    async def redirect_uri(self) -> str:
        async with self._opening:
            if self._callbacks.redirect_uri is None:
                import uvicorn

                from bastion.transport.listener import QuietServer, http_protocol, listen

                sock = listen("127.0.0.1", self._port)
                self._server = QuietServer(uvicorn.Config(
                    self._callbacks, http=http_protocol(callback_bounds()), ws="none", loop="none", lifespan="off",
                    log_config=None, access_log=False))
                self._serving = asyncio.ensure_future(self._server.serve(sockets=[sock]))
                self._callbacks.redirect_uri = f"http://127.0.0.1:{sock.getsockname()[1]}{CALLBACK_PATH}"
                log.info("authorization redirects come back to %s", self._callbacks.redirect_uri)
        return self._callbacks.redirect_uri

    async def close(self) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)
            self._server = self._serving = None
