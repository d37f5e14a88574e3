"""The interceptor pipeline every client message goes through on its way to an upstream server.

An interceptor is an async callable ``(request, call_next) -> result``, the same shape as ASGI or
Starlette middleware: it may inspect or rewrite the request, refuse it by raising ``GatewayError``,
call ``call_next`` to pass it on, and inspect or rewrite the result on the way back (for example to
hide tools from a list). The innermost handler routes the request to the server that owns it. The
request, handler and interceptor types live in ``bastion.model``.
"""

from __future__ import annotations

from typing import Any, Sequence

from bastion.model import GatewayRequest, Handler, Interceptor


def build_pipeline(interceptors: Sequence[Interceptor], terminal: Handler) -> Handler:
    """Chain ``interceptors`` around ``terminal``; the first interceptor sees the request first."""
    handler = terminal
    for interceptor in reversed(interceptors):
        handler = _bind(interceptor, handler)
    return handler


def _bind(interceptor: Interceptor, call_next: Handler) -> Handler:
    async def handle(request: GatewayRequest) -> dict[str, Any]:
        return await interceptor(request, call_next)

    return handle
