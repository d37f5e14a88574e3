"""Which destinations a sandboxed server may reach: pure functions, no I/O.

Two steps, in this order, so a name that is not allowed is never even resolved:
1. ``decide_request(rules, host, port)``: does an allowlist rule match the host and port as written?
2. ``decide_addresses(rules, host, port, addresses)``: after resolving an allowed *name*, refuse
   addresses that point back into private networks (loopback, RFC 1918, link-local, cloud metadata...),
   unless that exact IP is allowlisted. An IP written in the request is normalised from every legacy
   encoding (decimal, octal, hex, short forms, IPv4-mapped IPv6) before it is compared.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Metadata services that are not already covered by "not globally routable".
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192")
)
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")
HOST_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
NUMERIC_LOOKING = re.compile(r"^[0-9a-fx.]+$")
NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


@dataclass(frozen=True)
class AllowRule:
    """One allowlist entry: an exact host, a ``*.`` subdomain wildcard, or an IP; always with a port."""

    host: str  # lowercase name without trailing dot, the suffix after "*." for wildcards, or canonical IP
    port: int
    wildcard: bool = False
    ip: IPAddress | None = None

    def matches_name(self, name: str, port: int) -> bool:
        if self.ip is not None or port != self.port:
            return False
        if self.wildcard:
            return name.endswith("." + self.host)
        return name == self.host

    def matches_ip(self, address: IPAddress, port: int) -> bool:
        return self.ip is not None and port == self.port and unmap(self.ip) == unmap(address)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    # Set when the request named an IP that a rule lists explicitly: no address-class check applies.
    explicit_ip: IPAddress | None = None


def parse_allow_rule(entry: str) -> AllowRule:
    """``host:port``, ``*.example.com:443``, ``127.0.0.1:8080`` or ``[::1]:8080``."""
    form = "write it as host:port, *.example.com:443 or [::1]:8080"
    host, sep, port_text = entry.strip().rpartition(":")
    if not sep or not host or not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5) \
            or not 0 < int(port_text) < 65536:
        raise ValueError(f"network entry {entry!r} needs a port from 1 to 65535; {form}")
    port = int(port_text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    literal = parse_ip_literal(host)
    if literal is not None:
        return AllowRule(host=str(literal), port=port, ip=literal)
    wildcard = host.startswith("*.")
    name = normalise_name(host[2:] if wildcard else host)
    if name is None or "*" in name:
        raise ValueError(f"network entry {entry!r} has an invalid host; {form}")
    return AllowRule(host=name, port=port, wildcard=wildcard)


def normalise_name(host: str) -> str | None:
    """Lowercase DNS name without the trailing dot, or None when it is not a plain ASCII hostname."""
    name = host.lower().rstrip(".")
    if not name or len(name) > 253 or not name.isascii():
        return None
    if not all(HOST_LABEL.match(label) for label in name.split(".")):
        return None
    return name


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address a host string denotes, in any encoding the C library would accept, else None."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.rstrip(".") if not text.endswith("..") else text
    try:
        return ipaddress.ip_address(text.split("%", 1)[0] if ":" in text else text)
    except ValueError:
        pass
    if NUMERIC_LOOKING.match(text.lower()):
        try:
            # inet_aton is what getaddrinfo uses: accepts 2130706433, 0x7f000001, 0177.0.0.1, 127.1.
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def unmap(address: IPAddress) -> IPAddress:
    """The IPv4 address hidden in IPv4-mapped (::ffff:a.b.c.d) or NAT64 (64:ff9b::a.b.c.d) IPv6."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64_PREFIX:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def internal_reason(address: IPAddress) -> str | None:
    """Why an address must not be reached from a sandbox by name, or None when it is public."""
    target = unmap(address)
    if target in METADATA_ADDRESSES or address in METADATA_ADDRESSES:
        return f"cloud metadata address{f' (embeds {target})' if target != address else ''}"
    embedded = f" (embeds {target})" if target != address else ""
    # Most specific first: Python also calls unspecified and reserved ranges "private".
    for label, flag in (
        ("loopback", target.is_loopback),
        ("unspecified", target.is_unspecified),
        ("link-local", target.is_link_local),
        ("multicast", target.is_multicast),
        ("reserved", target.is_reserved),
        ("private", target.is_private),
    ):
        if flag:
            return f"{label} address{embedded}"
    if not target.is_global:
        return f"non-public address{embedded}"
    return None


def decide_request(rules: tuple[AllowRule, ...], host: str, port: int) -> Decision:
    """Step 1, before any name resolution: is this host:port on the allowlist as written?"""
    if not 0 < port < 65536:
        return Decision(False, f"invalid port {port}")
    literal = parse_ip_literal(host)
    if literal is not None:
        if any(rule.matches_ip(literal, port) for rule in rules):
            return Decision(True, f"IP {literal} allowlisted explicitly", explicit_ip=literal)
        return Decision(False, f"{literal}:{port} is not on the allowlist")
    name = normalise_name(host)
    if name is None:
        return Decision(False, f"{host!r} is not a valid hostname")
    if NUMERIC_LABEL.match(name.rsplit(".", 1)[-1]):
        # No real TLD is numeric; a resolver might still read this as an address: never resolve it.
        return Decision(False, f"{host!r} is an ambiguous numeric host")
    for rule in rules:
        if rule.matches_name(name, port):
            return Decision(True, f"{name}:{port} matches {'*.' if rule.wildcard else ''}{rule.host}:{rule.port}")
    return Decision(False, f"{name}:{port} is not on the allowlist")


def decide_addresses(
    rules: tuple[AllowRule, ...], port: int, addresses: list[IPAddress]
) -> Decision:
    """Step 2, after resolving an allowed name: every address must be public or allowlisted by IP.

    All of them are checked, not just the first, so a name cannot smuggle an internal address in
    behind a public one; the proxy then connects only to addresses checked here (no second lookup).
    """
    if not addresses:
        return Decision(False, "name did not resolve")
    for address in addresses:
        if any(rule.matches_ip(address, port) for rule in rules):
            continue
        reason = internal_reason(address)
        if reason is not None:
            return Decision(False, f"resolves to {address}, a {reason}")
    return Decision(True, "all resolved addresses are public or allowlisted")
