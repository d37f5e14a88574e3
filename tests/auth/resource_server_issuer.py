"""A small authorization server for the resource-server tests, served on 127.0.0.1 by the test's own event loop:
its metadata (RFC 8414), its JWKS (which a test can rotate, take down or slow), and RFC 7662 introspection of the
opaque tokens a test registers; it counts what it is asked. Tokens are signed in-process with joserfc keys."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import serialization
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

RESOURCE = "https://mcp.example.test/mcp"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Issuer:
    base: str = ""
    keys: list[Any] = field(default_factory=list)  # published keys, the first is the current one
    mode: str = "ok"  # ok, down (HTTP 503), slow (waits `delay` seconds)
    delay: float = 0.0
    hits: dict[str, int] = field(default_factory=lambda: {"jwks": 0, "introspect": 0, "metadata": 0})
    active: dict[str, dict[str, Any]] = field(default_factory=dict)  # opaque token -> introspection answer
    introspection_auth: tuple[str, str] = ("bastion", "gateway-secret")
    seen_authorization: list[str] = field(default_factory=list)
    _server: asyncio.AbstractServer | None = None

    @property
    def issuer(self) -> str:
        return self.base

    # ------------------------------------------------------------------ keys and tokens
    def new_key(self, kind: str = "RSA") -> Any:
        key = RSAKey.generate_key(2048) if kind == "RSA" else ECKey.generate_key("P-256")
        kid = f"{kind.lower()}-{secrets.token_hex(4)}"
        return RSAKey.import_key({**key.as_dict(private=True), "kid": kid}) if kind == "RSA" else \
            ECKey.import_key({**key.as_dict(private=True), "kid": kid})

    def rotate(self, drop_old: bool = False, kind: str = "RSA") -> Any:
        key = self.new_key(kind)
        self.keys = [key] if drop_old else [key, *self.keys]
        return key

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": RESOURCE, "sub": "alice", "exp": now + 600, "iat": now,
                  "jti": secrets.token_hex(8), "scope": "mcp", "groups": ["engineering"]}
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, key: Any = None, alg: str | None = None, header: dict[str, Any] | None = None,
              **claims: Any) -> str:
        key = key if key is not None else self.keys[0]
        alg = alg or ("RS256" if key.key_type == "RSA" else "ES256")
        protected = {"alg": alg, "kid": key.kid, "typ": "at+jwt", **(header or {})}
        protected = {k: v for k, v in protected.items() if v is not None}
        return jwt.encode(protected, self.claims(**claims), key, algorithms=[alg])

    def unsigned_token(self, **claims: Any) -> str:
        return f"{_b64(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}." \
               f"{_b64(json.dumps(self.claims(**claims)).encode())}."

    def hs256_with_public_key(self, **claims: Any) -> str:
        """The HS/RS confusion: HS256 "signed" with the RSA public key, as a verifier that took the key as a secret
        would accept."""
        key = self.keys[0]
        pem = key.get_op_key("verify").public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo)
        signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'kid': key.kid}).encode())}." \
                        f"{_b64(json.dumps(self.claims(**claims)).encode())}"
        signature = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(signature)}"

    def opaque(self, **answer: Any) -> str:
        token = secrets.token_urlsafe(32)
        now = int(time.time())
        self.active[token] = {"active": True, "iss": self.issuer, "aud": RESOURCE, "sub": "carol",
                              "scope": "mcp", "exp": now + 600, **answer}
        return token

    # ------------------------------------------------------------------ serving
    async def start(self) -> "Issuer":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        if not self.keys:
            self.rotate()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *header_lines = request.split("\r\n")
            method, path, _ = line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            status, document = await self._answer(method, path, headers, body)
            payload = json.dumps(document).encode()
            writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}"
                         f"\r\nconnection: close\r\n\r\n".encode() + payload)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        if path == "/.well-known/oauth-authorization-server":
            self.hits["metadata"] += 1
            return 200, {"issuer": self.issuer, "jwks_uri": f"{self.base}/jwks",
                         "introspection_endpoint": f"{self.base}/introspect"}
        if path == "/jwks":
            self.hits["jwks"] += 1
            if self.mode == "down":
                return 503, {"error": "down"}
            if self.mode == "slow":
                await asyncio.sleep(self.delay)
            return 200, {"keys": [k.as_dict(private=False) for k in self.keys]}
        if path == "/introspect" and method == "POST":
            self.hits["introspect"] += 1
            if self.mode == "down":
                return 503, {"error": "down"}
            expected = "Basic " + base64.b64encode(":".join(self.introspection_auth).encode()).decode()
            if headers.get("authorization") != expected:
                return 401, {"error": "invalid_client"}
            token = (parse_qs(body.decode()).get("token") or [""])[0]
            return 200, self.active.get(token, {"active": False})
        return 404, {"error": "not found"}


class IssuerThread:
    """An Issuer served by an event loop of its own, in a thread: for a gateway process that outlives one test's
    loop. Its state (keys, mode) is set from the test's thread as plain attributes."""

    def __init__(self) -> None:
        import threading
        self.issuer = Issuer()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Issuer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.issuer.start(), self._loop).result(30)
        return self.issuer

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.issuer.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
