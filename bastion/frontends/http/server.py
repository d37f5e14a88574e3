"""Running the HTTP frontend: its TLS settings, uvicorn on the running loop (bastion/transport/listener.py), and a
clean stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

import orjson
import uvicorn

from bastion.auth.build import HttpAuth
from bastion.auth.config import AuthConfig
from bastion.config import HttpConfig, client_certificate_contradiction
from bastion.frontends.http.app import HttpFrontend
from bastion.frontends.http.guards import TrustedProxies
from bastion.frontends.http.records import KeyRing
from bastion.frontends.http.wire import error_body
from bastion.gateway.core import Gateway
from bastion.transport.listener import (ConnectionBounds, QuietServer, http_protocol, is_loopback, listen,
                                        raise_file_limit, raw_response)

log = logging.getLogger("bastion.http")


async def serve_http(gateway: Gateway, settings: HttpConfig, host: str, port: int, *, auth: HttpAuth | None = None,
                     callback: Any = None, json_logs: bool = False,
                     session_keys: KeyRing | None = None) -> signal.Signals | None:
    """Serve until SIGTERM or SIGINT; the signal that stopped it. SIGHUP is not a stop: it reloads the
    configuration (``bastion.cli.gateway.with_reloading``). ``json_logs``: the address is said as a log record, so
    every line on stderr is one JSON object."""
    sock = listen(host, port)  # first: an address in use is said before any server starts
    gateway.start()
    frontend = HttpFrontend(gateway, settings, bound_to_loopback=is_loopback(host), auth=auth, callback=callback,
                            session_keys=session_keys)
    tls = settings.tls_cert is not None
    bounds = connection_bounds(settings)
    config = uvicorn.Config(
        # ws="none": Bastion serves no WebSocket, and a connection upgraded to one would leave the bounds uncounted.
        # An idle keep-alive connection is closed at http.header_timeout by the bounds (silently, as uvicorn's own
        # keep-alive timeout, set to the same, would).
        frontend, http=http_protocol(bounds), ws="none", loop="none", lifespan="off", proxy_headers=False,
        server_header=False, access_log=False, log_config=None, timeout_keep_alive=settings.header_timeout,
        timeout_graceful_shutdown=5,
        ssl_certfile=str(settings.tls_cert) if tls else None, ssl_keyfile=str(settings.tls_key) if tls else None,
        **_client_certificates(settings),
    )
    server = QuietServer(config)
    stopped_by: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        if not stopped_by:
            stopped_by.append(sig)
            loop.create_task(_stop(frontend, server))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    frontend.start()
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # One line a person (or a test) reads for the address, the port 0 asked for included.
    serving = (f"serving MCP on {'https' if tls else 'http'}://{shown}:{bound_port}/mcp "
               f"({len(gateway.config.servers)} server(s))")
    if json_logs:
        log.info("%s", serving)
    else:
        print(f"bastion: {serving}", file=sys.stderr, flush=True)
    if not is_loopback(host) and not settings.allowed_hosts:
        log.warning("listening on %s with no http.allowed_hosts: any Host header is accepted", host)
    try:
        await server.serve(sockets=[sock])
    finally:
        await frontend.stop()
        await gateway.close()
    return stopped_by[0] if stopped_by else None


# The request line and headers of one request, at most: uvicorn's httptools parser has no bound of its own. A request
# whose headers end within the read that passes it is still read (a read is at most 256 KiB).
MAX_HEADER_BYTES = 64 * 1024

# Open files kept for everything but client connections (servers' pipes, remote servers' connections, logs, the
# audit trail, the listening socket): at most this many, and a quarter of a small limit.
FILES_KEPT = 1024


def fit_to_file_limit(max_connections: int, max_per_address: int, file_limit: int) -> tuple[int, int]:
    """The connection bounds that fit ``file_limit`` open files with room kept for the rest: the total lowered to
    fit, and the per-address bound, if the total fell to it, to half the total (one address never takes all)."""
    total = max(1, min(max_connections, file_limit - min(FILES_KEPT, file_limit // 4)))
    per_address = max_per_address if max_per_address < total else max(1, total // 2)
    return total, per_address


def connection_bounds(settings: HttpConfig) -> ConnectionBounds:
    """The listener's connection bounds from the http table, the soft open-file limit raised as far as they need
    (within the hard limit) and the bounds lowered, with a warning, where even that is short."""
    file_limit = raise_file_limit(settings.max_connections + FILES_KEPT)
    total, per_address = fit_to_file_limit(settings.max_connections, settings.max_connections_per_address,
                                           file_limit)
    if (total, per_address) != (settings.max_connections, settings.max_connections_per_address):
        log.warning("this process may open %d files (ulimit -n), so it takes at most %d connections "
                    "(http.max_connections: %d), %d from one address (http.max_connections_per_address: %d); "
                    "raise the limit to take more", file_limit, total, settings.max_connections, per_address,
                    settings.max_connections_per_address)
    retry = settings.retry_after_seconds

    def full(message: str) -> bytes:
        body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32000, "message": f"{message}; retry in {retry} s", "data": {"retryAfterSeconds": retry}}})
        return raw_response(503, "Service Unavailable", body, b"application/json",
                            ((b"retry-after", str(retry).encode()),))

    late = error_body(None, -32600, f"the request line and headers did not arrive within "
                                    f"{settings.header_timeout:g} s (http.header_timeout)")
    proxies = TrustedProxies(settings.trusted_proxies)
    return ConnectionBounds(
        header_timeout=settings.header_timeout, max_connections=total, max_per_address=per_address,
        max_header_bytes=MAX_HEADER_BYTES, late_answer=raw_response(408, "Request Timeout", late, b"application/json"),
        too_large_answer=raw_response(431, "Request Header Fields Too Large", error_body(
            None, -32600, f"the request line and headers exceed {MAX_HEADER_BYTES} bytes"), b"application/json"),
        full_answer=full(f"{total} connections are open, the most this gateway takes (http.max_connections)"),
        address_full_answer=full(f"{per_address} connections from this address are open, the most this gateway "
                                 f"takes from one (http.max_connections_per_address)"),
        exempt=proxies.trusts if settings.trusted_proxies else None)


async def _stop(frontend: HttpFrontend, server: uvicorn.Server) -> None:
    await frontend.stop()
    server.should_exit = True


def with_client_ca(settings: HttpConfig, auth: AuthConfig | None, base: Path) -> HttpConfig:
    """``settings`` with http.client_ca_file read from the configuration's folder; a ValueError names the
    contradiction and the fix (mutual TLS without TLS, certificates mapped that nobody asks for)."""
    if (contradiction := client_certificate_contradiction(settings, auth)) is not None:
        raise ValueError(contradiction)
    if settings.client_ca_file is None:
        return settings
    if settings.tls_cert is None:
        raise ValueError("http.client_ca_file asks clients for a certificate in the TLS handshake, but the gateway "
                         "serves plain HTTP: set http.tls_cert and http.tls_key (or --tls-cert and --tls-key)")
    ca_file = (base / settings.client_ca_file.expanduser()).resolve()
    if not ca_file.is_file():
        raise ValueError(f"http.client_ca_file: {ca_file} does not exist or is not a file")
    return settings.model_copy(update={"client_ca_file": ca_file})


def _client_certificates(settings: HttpConfig) -> dict[str, Any]:
    """uvicorn's TLS settings for mutual TLS: the client CA, and whether a certificate is required."""
    if settings.client_ca_file is None:
        return {}
    required = settings.client_cert_mode == "required"
    return {"ssl_ca_certs": str(settings.client_ca_file),
            "ssl_cert_reqs": ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL}


