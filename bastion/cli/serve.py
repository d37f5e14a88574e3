"""``bastion serve CONFIG --http HOST:PORT``: one gateway for many clients over HTTP."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from bastion.cli.conventions import add_global_flags
from bastion.cli.gateway import add_log_format

log = logging.getLogger("bastion")

DEFAULT_ADDRESS = "127.0.0.1:8080"


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve", help="serve the federated servers to many MCP clients over HTTP (Streamable HTTP at /mcp, "
                      "HTTP+SSE at /sse)")
    serve.add_argument("config", nargs="?", help="configuration file (default: the built-in demo configuration)")
    serve.add_argument("--http", metavar="HOST:PORT", default=DEFAULT_ADDRESS,
                       help=f"address to listen on (default {DEFAULT_ADDRESS}; port 0 picks a free one; a "
                            "non-loopback host is reachable from other machines)")
    serve.add_argument("--tls-cert", metavar="FILE", type=Path, help="PEM certificate chain: serve HTTPS "
                                                                       "(overrides http.tls_cert)")
    serve.add_argument("--tls-key", metavar="FILE", type=Path, help="PEM private key of --tls-cert")
    add_log_format(serve)
    add_global_flags(serve)
    serve.set_defaults(handler=_serve)


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080 or 0.0.0.0:8080")
    return (host or "127.0.0.1").strip("[]"), int(port)


def _serve(args: argparse.Namespace) -> int:
    from bastion.auth.build import build_http_auth
    from bastion.cli.gateway import (_load, json_logs, run_loop, setup_logging, with_operations_listener,
                                     with_status_board)
    from bastion.compose import build_gateway
    from bastion.frontends.http.records import KeyRing
    from bastion.frontends.http.server import is_loopback, serve_http, with_client_ca

    setup_logging(args)
    try:
        host, port = parse_address(args.http)
    except ValueError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return 2
    config = _load(args)
    if config is None:
        return 2
    settings = config.http
    cert = args.tls_cert or settings.tls_cert
    key = args.tls_key or settings.tls_key
    if (cert is None) != (key is None):
        print("bastion: TLS needs both a certificate and its key (--tls-cert and --tls-key, or http.tls_cert and "
              "http.tls_key)", file=sys.stderr)
        return 2
    if cert is not None:
        base = config.source.parent if config.source is not None else Path.cwd()
        cert, key = (base / cert).resolve(), (base / key).resolve()
        for what, path in (("certificate", cert), ("key", key)):
            if not path.is_file():
                print(f"bastion: the TLS {what} {path} does not exist or is not a file", file=sys.stderr)
                return 2
        settings = settings.model_copy(update={"tls_cert": cert, "tls_key": key})
    try:
        settings = with_client_ca(settings, config.auth, config.source.parent if config.source else Path.cwd())
        session_keys = (KeyRing.from_files(settings.session_key_files, config.source.parent if config.source else None)
                        if settings.session_key_files else None)
    except ValueError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return 2
    gateway = build_gateway(config, log_context=json_logs(args))
    try:
        auth = build_http_auth(config.auth, identity_header=settings.identity_header, identity=gateway.identity,
                               base=config.source.parent if config.source is not None else None)
    except ValueError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return 2
    if not auth.required and not is_loopback(host):
        log.warning("bastion serve: %s is reachable from other machines and no caller is authenticated: every "
                    "request is %s; configure the auth table (or http.identity_header behind a proxy that "
                    "authenticates)", args.http, gateway.identity.name)
    callback = None
    if config.auth is not None and config.auth.resource is not None:
        # Users' authorizations of upstream servers come back to this frontend, at the origin clients reach it at.
        parts = urlsplit(config.auth.resource)
        gateway.authorization_codes.served_at(f"{parts.scheme}://{parts.netloc}")
        callback = gateway.authorization_codes.callbacks
    gc.freeze()  # what is loaded by now lives as long as the process; see bastion run
    try:
        stopped_by = run_loop(with_status_board(gateway, with_operations_listener(
            gateway, serve_http(gateway, settings, host, port, auth=auth, callback=callback,
                                json_logs=json_logs(args), session_keys=session_keys))))
    except OSError as exc:
        print(f"bastion: cannot listen on {exc.filename or args.http}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if stopped_by == signal.SIGINT:
        raise KeyboardInterrupt
    return 0
