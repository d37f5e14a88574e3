"""The operations endpoints as plain ASGI answers: ``/metrics`` (whoever may read it is decided by the caller),
``/healthz`` and ``/readyz``; and the separate, unauthenticated listener of ``[metrics] listen`` that serves all
three (the only way to read the metrics of ``bastion run`` on stdio)."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import uvicorn

from bastion.observability.health import ALIVE, readiness
from bastion.transport.listener import (ConnectionBounds, QuietServer, http_protocol, is_loopback, listen,
                                        raw_response)

if TYPE_CHECKING:
    from bastion.gateway.core import Gateway

log = logging.getLogger("bastion.metrics")

HEALTH_PATHS = ("/healthz", "/readyz")
METRICS_PATH = "/metrics"
_JSON = b"application/json"
_NO_STORE = (b"cache-control", b"no-store")

Send = Callable[[dict[str, Any]], Awaitable[None]]


async def respond(send: Send, status: int, content_type: bytes, body: bytes,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    try:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", content_type), (b"content-length", str(len(body)).encode()), _NO_STORE, *headers]})
        await send({"type": "http.response.body", "body": body})
    except OSError:
        pass  # the prober left


async def answer_health(gateway: "Gateway", path: str, method: str, send: Send) -> None:
    """``/healthz``: 200 while the process answers. ``/readyz``: 200 when ready, 503 when not."""
    if method not in ("GET", "HEAD"):
        await respond(send, 405, _JSON, b'{"error":"GET only"}', ((b"allow", b"GET, HEAD"),))
        return
    if path == "/healthz":
        await respond(send, 200, _JSON, ALIVE)
        return
    ready, body = await readiness(gateway)
    await respond(send, 200 if ready else 503, _JSON, body)


async def answer_metrics(gateway: "Gateway", method: str, send: Send) -> None:
    """The gateway's metrics in the Prometheus text format (the caller has decided that they may be read)."""
    if method not in ("GET", "HEAD"):
        await respond(send, 405, _JSON, b'{"error":"GET only"}', ((b"allow", b"GET, HEAD"),))
        return
    # Imported on the first scrape: prometheus-client takes 60 ms to import (see bastion.compose.attach_metrics).
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    from bastion.observability.collector import exposition, registry_of

    await respond(send, 200, CONTENT_TYPE_LATEST.encode(), exposition(registry_of(gateway)))


class MetricsListenerApp:
    """The ASGI app of ``[metrics] listen``: the three endpoints, to whoever reaches the address. On a loopback
    address only a loopback Host is answered: a web page cannot read the metrics through a name it points at
    127.0.0.1 (DNS rebinding)."""

    def __init__(self, gateway: "Gateway", *, loopback: bool) -> None:
        self.gateway = gateway
        self._loopback = loopback

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            if self._loopback and not is_loopback(_host_of(scope)):
                await respond(send, 403, _JSON, b'{"error":"this listener answers only a loopback Host"}')
            elif path == METRICS_PATH:
                await answer_metrics(self.gateway, method, send)
            elif path in HEALTH_PATHS:
                await answer_health(self.gateway, path, method, send)
            else:
                await respond(send, 404, _JSON, b'{"error":"nothing here: /metrics, /healthz, /readyz"}')
        except Exception:  # noqa: BLE001 - a fault here must never reach the gateway
            log.exception("internal error while answering %s on the metrics listener", path)
            await respond(send, 500, _JSON, b'{"error":"internal error in Bastion"}')


def _host_of(scope: dict[str, Any]) -> str:
    """The Host header's host, without its port (``[::1]:9464`` -> ``::1``); "" when there is none."""
    host = next((value.decode("latin-1") for name, value in scope.get("headers", ()) if name == b"host"), "")
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


# What the unauthenticated listener takes: a scraper and a few probes need little, and whoever else reaches it must
# not hold it open (slow headers) or crowd them out.
LISTENER_CONNECTIONS = 32
LISTENER_CONNECTIONS_PER_ADDRESS = 8
LISTENER_HEADER_TIMEOUT = 10.0
LISTENER_HEADER_BYTES = 16 * 1024


def listener_bounds() -> ConnectionBounds:
    def answer(status: int, reason: str, why: str) -> bytes:
        return raw_response(status, reason, b'{"error":"' + why.encode() + b'"}', _JSON)

    return ConnectionBounds(
        header_timeout=LISTENER_HEADER_TIMEOUT, max_connections=LISTENER_CONNECTIONS,
        max_per_address=LISTENER_CONNECTIONS_PER_ADDRESS, max_header_bytes=LISTENER_HEADER_BYTES,
        late_answer=answer(408, "Request Timeout", "the request line and headers came too late"),
        too_large_answer=answer(431, "Request Header Fields Too Large", "the request line and headers are too large"),
        full_answer=answer(503, "Service Unavailable", "too many connections"),
        address_full_answer=answer(503, "Service Unavailable", "too many connections from this address"))


async def serve_metrics_listener(gateway: "Gateway", sock: socket.socket, *, loopback: bool) -> None:
    """Serve ``MetricsListenerApp`` on the bound ``sock`` until cancelled."""
    config = uvicorn.Config(MetricsListenerApp(gateway, loopback=loopback), http=http_protocol(listener_bounds()),
                            ws="none", loop="none", lifespan="off", proxy_headers=False, server_header=False,
                            access_log=False, log_config=None, timeout_keep_alive=LISTENER_HEADER_TIMEOUT)
    server = QuietServer(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        raise


async def with_metrics_listener(gateway: "Gateway", serving: Awaitable[Any]) -> Any:
    """``serving`` with the ``[metrics] listen`` listener beside it, when one is configured. Its address is taken
    first: one in use raises OSError before anything is served."""
    metrics = gateway.metrics
    address = metrics.config.address if metrics is not None else None
    if address is None:
        return await serving
    host, port = address
    try:
        sock = listen(host, port)
    except OSError as error:
        getattr(serving, "close", lambda: None)()  # never started: no "never awaited" warning
        raise OSError(error.errno, error.strerror, f"{metrics.config.listen} (metrics.listen)") from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # One line a person (or a test) reads for the address, the port 0 asked for included.
    print(f"bastion: serving metrics on http://{shown}:{bound_port}/metrics", file=sys.stderr, flush=True)
    loopback = is_loopback(host)
    if not loopback:
        log.warning("metrics.listen %s is reachable from other machines and serves /metrics to anyone, "
                    "unauthenticated: keep it on loopback or a private network", metrics.config.listen)
    listener = asyncio.ensure_future(serve_metrics_listener(gateway, sock, loopback=loopback))
    try:
        return await serving
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
