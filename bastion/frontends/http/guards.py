"""Pure decisions about one HTTP request's headers: where it comes from, whether its Host and Origin may reach
the gateway, and whether a 2026-07-28 request's routing headers agree with its body. No I/O here."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from bastion.protocol.mirrored_headers import annotated_params, argument_at, decode_header_value, rendered

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
NAME_BEARING_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


@dataclass(frozen=True, slots=True)
class Peer:
    """Who sent a request, after believing (or not) a proxy's forwarded headers."""

    address: str
    scheme: str
    host: str  # the Host the client addressed, without port


class TrustedProxies:
    def __init__(self, networks: Sequence[str]) -> None:
        self._networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)

    def trusts(self, address: str) -> bool:
        if not self._networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._networks)

    def resolve(self, address: str, scheme: str, headers: Mapping[str, str]) -> Peer:
        """The client behind the proxies: X-Forwarded-* are read only when the direct peer is a trusted proxy, and
        the forwarded-for chain is walked from the right past every trusted hop."""
        host = host_without_port(headers.get("host", ""))
        if not self.trusts(address):
            return Peer(address, scheme, host)
        chain = [hop.strip() for hop in headers.get("x-forwarded-for", "").split(",") if hop.strip()]
        client = address
        while chain:
            client = chain.pop()
            if not self.trusts(client):
                break
        proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
        forwarded_host = headers.get("x-forwarded-host", "").split(",")[0].strip()
        return Peer(client, proto if proto in ("http", "https") else scheme,
                    host_without_port(forwarded_host) if forwarded_host else host)


    def site(self, address: str, scheme: str, headers: Mapping[str, str]) -> tuple[str, str]:
        """The scheme and ``host[:port]`` the client addressed (what its browser's Origin names for a page of this
        gateway): the proxy's X-Forwarded-Proto and X-Forwarded-Host when the direct peer is a trusted proxy."""
        netloc = headers.get("host", "")
        if self.trusts(address):
            proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
            scheme = proto if proto in ("http", "https") else scheme
            netloc = headers.get("x-forwarded-host", "").split(",")[0].strip() or netloc
        return scheme, netloc.strip().lower()


def host_without_port(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8080
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        return host.rsplit(":", 1)[0]
    return host


class OriginGuard:
    """DNS-rebinding protection: a page on another site must not drive a gateway on this machine. The Host must be
    one the gateway answers to, and a browser's Origin must be allowed."""

    def __init__(self, *, bound_to_loopback: bool, allowed_hosts: Sequence[str], allowed_origins: Sequence[str]) -> None:
        hosts = {host_without_port(h) for h in allowed_hosts}
        if not hosts and bound_to_loopback:
            hosts = set(LOOPBACK_NAMES)
        self._hosts = frozenset(hosts)  # empty: any host
        self._any_origin = "*" in allowed_origins
        self._origins = frozenset(o.rstrip("/").lower() for o in allowed_origins if o != "*")

    def refusal(self, peer: Peer, origin: str | None) -> str | None:
        """Why this request may not proceed, or None."""
        if self._hosts and peer.host not in self._hosts:
            return f"Host {peer.host!r} is not one this gateway answers to (http.allowed_hosts)"
        if origin is None or self._any_origin:
            return None
        origin = origin.rstrip("/").lower()
        if origin in self._origins:
            return None
        if origin != "null" and host_without_port(urlsplit(origin).netloc) in LOOPBACK_NAMES and \
                peer.host in LOOPBACK_NAMES:
            return None  # a page served from this machine, to a gateway addressed on this machine
        return f"Origin {origin!r} is not allowed (http.allowed_origins)"


def modern_header_mismatch(body: Mapping[str, Any], headers: Mapping[str, str], protocol_version: Any) -> str | None:
    """Why a 2026-07-28 request's MCP-Protocol-Version, Mcp-Method or Mcp-Name header disagrees with its body (answered
    with -32020 and status 400), or None."""
    version_header = headers.get("mcp-protocol-version")
    if version_header is None or version_header != protocol_version:
        return "the MCP-Protocol-Version header does not match the request's protocol version in params._meta"
    method = body.get("method")
    if headers.get("mcp-method") != method:
        return "the Mcp-Method header does not match the request body's method"
    key = NAME_BEARING_METHODS.get(method) if isinstance(method, str) else None
    params = body.get("params")
    if key is not None and isinstance(params, Mapping) and params.get(key) is not None:
        if decode_header_value(headers.get("mcp-name")) != params.get(key):
            return f"the Mcp-Name header does not match the request body's {key!r}"
    return None


def accepts(accept: str | None, media_type: str) -> bool:
    """Whether an Accept header admits ``media_type``; a missing header admits everything."""
    if not accept:
        return True
    major = media_type.split("/")[0]
    for part in accept.split(","):
        kind = part.split(";")[0].strip().lower()
        if kind in (media_type, "*/*", f"{major}/*"):
            return True
    return False


def is_json_content(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "application/json"


_DECIMAL = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")


def param_header_mismatch(input_schema: Any, arguments: Any, headers: Mapping[str, str]) -> str | None:
    """Why a 2026-07-28 tools/call's ``Mcp-Param-*`` headers disagree with the arguments its tool's schema marks
    ``x-mcp-header`` (SEP-2243: present together and equal, or absent together), or None. Answered with -32020."""
    arguments = arguments if isinstance(arguments, Mapping) else {}
    for path, token in annotated_params(input_schema).items():
        header = f"Mcp-Param-{token}"
        raw = headers.get(header.lower())
        value = argument_at(arguments, path)
        argument = ".".join(path)
        written = rendered(value)
        if written is None:
            if raw is not None:
                return f"the {header} header is present but the argument {argument!r} is absent or not a scalar"
            continue
        if raw is None:
            return f"the {header} header is missing but the argument {argument!r} is present"
        decoded = decode_header_value(raw)
        if decoded is None:
            return f"the {header} header carries a malformed =?base64?...?= value"
        if decoded != written and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                        and _DECIMAL.match(decoded) and float(decoded) == value):
            return f"the {header} header does not match the argument {argument!r}"
    return None
