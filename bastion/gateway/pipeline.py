"""The interceptor pipeline every client message goes through on its way to an upstream server.

An interceptor is an async callable ``(request, call_next) -> result``, the same shape as ASGI or
Starlette middleware: it may inspect or rewrite the request, refuse it by raising ``GatewayError``,
call ``call_next`` to pass it on, and inspect or rewrite the result on the way back (for example to
hide tools from a list). The innermost handler routes the request to the server that owns it. A server's
request to a client and a server's notification pass, the other way, the interceptors that name their method in
``methods`` (``request.server`` says which server); the innermost handler there asks or tells the client. The
request, handler and interceptor types live in ``bastion.model``.
"""

from __future__ import annotations

from typing import Any, Awaitable, Sequence

from bastion.model import GatewayRequest, Handler, Interceptor


def build_pipeline(interceptors: Sequence[Interceptor], terminal: Handler) -> Handler:
    """Chain ``interceptors`` around ``terminal``; the first interceptor sees the request first."""
    handler = terminal
    for interceptor in reversed(interceptors):
        handler = _bind(interceptor, handler)
    return handler


def passes_raw(interceptors: Sequence[Interceptor], method: str, part: str) -> bool:
    """Whether ``part`` (``"params"`` or ``"results"``) of ``method``'s requests may stay the JSON bytes they
    came in through this chain: no interceptor reads it. An interceptor says what it does not read with the
    attributes ``methods`` (the only methods it looks at; all when absent), ``reads_params`` and
    ``reads_results`` (True when absent), so one that declares nothing is given decoded params and results."""
    return not any(_reads(interceptor, method, part) for interceptor in interceptors)


def _reads(interceptor: Interceptor, method: str, part: str) -> bool:
    methods = getattr(interceptor, "methods", None)
    if methods is not None and method not in methods:
        return False
    # "raw": it reads them, but takes them as the bytes they came in too (a guardrail that decodes a result itself
    # and passes the server's bytes on when it changes nothing).
    return getattr(interceptor, f"reads_{part}", True) not in (False, "raw")


def _bind(interceptor: Interceptor, call_next: Handler) -> Handler:
    # A plain function handing back the interceptor's own coroutine: a layer of its own would be one more coroutine to
    # create and resume per interceptor per request, on every request.
    methods = getattr(interceptor, "methods", None)
    if methods is not None and getattr(interceptor, "passes_other_methods", False):
        # It only passes on a request of a method it does not name: not called at all then, no coroutine of its own.
        def handle_named(request: GatewayRequest) -> Awaitable[dict[str, Any]]:
            return interceptor(request, call_next) if request.method in methods else call_next(request)

        return handle_named

    def handle(request: GatewayRequest) -> Awaitable[dict[str, Any]]:
        return interceptor(request, call_next)

    return handle
