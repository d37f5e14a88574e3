"""Running the HTTP frontend: its TLS settings, uvicorn on the running loop (bastion/transport/listener.py), and a
clean stop."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

import uvicorn

from bastion.auth.build import HttpAuth
from bastion.auth.config import AuthConfig
from bastion.config import HttpConfig, client_certificate_contradiction
from bastion.frontends.http.app import HttpFrontend
from bastion.gateway.core import Gateway
from bastion.transport.listener import QuietServer, http_protocol, listen

log = logging.getLogger("bastion.http")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def serve_http(gateway: Gateway, settings: HttpConfig, host: str, port: int, *, auth: HttpAuth | None = None,
                     callback: Any = None) -> signal.Signals | None:
    """Serve until SIGTERM, SIGINT or SIGHUP; the signal that stopped it."""
    sock = listen(host, port)  # first: an address in use is said before any server starts
    gateway.start()
    frontend = HttpFrontend(gateway, settings, bound_to_loopback=is_loopback(host), auth=auth, callback=callback)
    tls = settings.tls_cert is not None
    config = uvicorn.Config(
        frontend, http=http_protocol(), loop="none", lifespan="off", proxy_headers=False, server_header=False,
        access_log=False, log_config=None, timeout_keep_alive=30, timeout_graceful_shutdown=5,
        ssl_certfile=str(settings.tls_cert) if tls else None, ssl_keyfile=str(settings.tls_key) if tls else None,
        **_client_certificates(settings), h11_max_incomplete_event_size=64 * 1024,
    )
    server = QuietServer(config)
    stopped_by: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        if not stopped_by:
            stopped_by.append(sig)
            loop.create_task(_stop(frontend, server))

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop, sig)
    frontend.start()
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    # One line a person (or a test) reads for the address, the port 0 asked for included.
    print(f"bastion: serving MCP on {'https' if tls else 'http'}://{shown}:{bound_port}/mcp "
          f"({len(gateway.config.servers)} server(s))", file=sys.stderr, flush=True)
    if not is_loopback(host) and not settings.allowed_hosts:
        log.warning("listening on %s with no http.allowed_hosts: any Host header is accepted", host)
    try:
        await server.serve(sockets=[sock])
    finally:
        await frontend.stop()
        await gateway.close()
    return stopped_by[0] if stopped_by else None


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


