"""URL guard: scheme allowlist, host allow/deny lists, and no internal addresses in any spelling.

The URL is parsed strictly and refused when browsers (WHATWG) and Python would disagree about its host:
backslashes, whitespace, control characters and missing ``//`` after a special scheme are refused outright.
The host is percent-decoded and Unicode-folded (fullwidth digits, ideographic dots), then read as an IP
address the way ``inet_aton`` does (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``). Addresses that
are not globally routable — private, loopback, link-local, multicast, reserved, unspecified, shared, and the
cloud metadata endpoints — are refused, including IPv4 embedded in IPv6 (mapped, compatible, 6to4, NAT64,
Teredo). Names that are internal by convention (``localhost``, ``*.internal``…) are refused too. DNS is never
queried: a public name that resolves to a private address must be stopped by an allowlist.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from fnmatch import translate

from bastion.policy.decision import PASS, GuardResult, refuse
from bastion.policy.guards.decoding import compatibility_form, decode_fully

_SPECIAL_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp"})
# Characters WHATWG and Python parsers treat differently (stripped, or read as "/"), and all whitespace.
_UNSAFE = re.compile(r"[\x00-\x20\x7f-\x9f\\\\\s]")
_HOST_CHARACTERS = re.compile(r"[a-z0-9._\-\u0080-\U0010ffff]+")
_NUMERIC_LABEL = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")
_AUTHORITY_END = re.compile(r"[/?#]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# The usual shape: a scheme, "//", a host of ASCII letters, digits, hyphens and inner dots, an optional port
# of up to five digits, then printable ASCII without backslashes. Every value it matches passes the full
# parser's syntax checks and yields the same scheme, host and port (no userinfo, brackets, encodings or
# characters parsers disagree on can be in it), so only the host checks remain; anything else is parsed
# in full.
_PLAIN_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::([0-9]{1,5}))?(?:[/?#][!-\[\]-~]*)?")
_IDEOGRAPHIC_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "192.0.0.192", "fd00:ec2::254")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
INTERNAL_HOST_PATTERNS: tuple[str, ...] = (
    "localhost",
    "*.localhost",
    "localhost.localdomain",
    "ip6-localhost",
    "ip6-loopback",
    "*.local",
    "*.internal",
    "*.intranet",
    "*.lan",
    "*.home.arpa",
    "metadata",
    "instance-data",
    "*.in-addr.arpa",
    "*.ip6.arpa",
    # Wildcard DNS services that answer any embedded address, e.g. 127.0.0.1.nip.io.
    "*.nip.io",
    "*.sslip.io",
    "*.xip.io",
    "*.localtest.me",
    "localtest.me",
    "*.lvh.me",
    "lvh.me",
)


class _HostMatcher:
    """Host wildcards ("*.example.com") matched as fnmatch would, without a regex for the plain shapes.

    A pattern without wildcards is an exact name and ``*.suffix`` (no other wildcard) is a suffix test:
    both are set and ``endswith`` lookups, exactly what the translated regex would accept. Any other
    pattern keeps its fnmatch regex.
    """

    __slots__ = ("_exact", "_suffixes", "_regex")

    def __init__(self, patterns: tuple[str, ...]) -> None:
        exact: set[str] = set()
        suffixes: list[str] = []
        complex_patterns: list[str] = []
        for raw in patterns:
            pattern = raw.lower().rstrip(".")
            if not any(c in pattern for c in "*?["):
                exact.add(pattern)
            elif pattern.startswith("*") and not any(c in pattern[1:] for c in "*?["):
                suffixes.append(pattern[1:])
            else:
                complex_patterns.append(pattern)
        self._exact = frozenset(exact)
        self._suffixes = tuple(suffixes)
        self._regex = (
            re.compile("|".join(f"(?:{translate(p)})" for p in complex_patterns)) if complex_patterns else None
        )

    def match(self, host: str) -> bool:
        if host in self._exact or host.endswith(self._suffixes):
            return True
        return self._regex is not None and self._regex.match(host) is not None


def _host_pattern(patterns: tuple[str, ...]) -> _HostMatcher | None:
    """One matcher for a list of host wildcards ("*.example.com"), matched case-insensitively."""
    if not patterns:
        return None
    return _HostMatcher(patterns)


@dataclass(frozen=True, slots=True)
class UrlRules:
    schemes: tuple[str, ...] = ("https", "http")
    allow_hosts: tuple[str, ...] = ()  # empty: any public host
    deny_hosts: tuple[str, ...] = ()
    allow_private: bool = False
    allow_userinfo: bool = False
    allowed_ports: tuple[int, ...] = ()
    internal_hosts: tuple[str, ...] = field(default=INTERNAL_HOST_PATTERNS)
    _allow: _HostMatcher | None = field(init=False, repr=False, compare=False)
    _deny: _HostMatcher | None = field(init=False, repr=False, compare=False)
    _internal: _HostMatcher | None = field(init=False, repr=False, compare=False)
    # Verdicts by (host, scheme, port): a pure function of them and the rules, and agents call the
    # same few hosts again and again.
    _verdicts: dict[tuple[str, str, int | None], GuardResult] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_verdicts", {})
        object.__setattr__(self, "_allow", _host_pattern(self.allow_hosts))
        object.__setattr__(self, "_deny", _host_pattern(self.deny_hosts))
        object.__setattr__(self, "_internal", _host_pattern(self.internal_hosts))


def parse_ipv4_loose(host: str) -> ipaddress.IPv4Address | None:
    """Read ``host`` as IPv4 the way inet_aton and browsers do; None when it is not numeric."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers: list[int] = []
    for part in parts:
        if not part:
            return None
        try:
            if part[:2].lower() == "0x":
                number = int(part[2:] or "0", 16)
            elif len(part) > 1 and part[0] == "0":
                number = int(part[1:], 8)
            else:
                if not part.isdigit():
                    return None
                number = int(part, 10)
        except ValueError:
            return None
        numbers.append(number)
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for index, n in enumerate(head):
        value += n << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _looks_numeric(host: str) -> bool:
    # WHATWG: a host whose last label is a number must be an IPv4 address (or the URL is invalid).
    return _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]) is not None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found = [a for a in (address.ipv4_mapped, address.sixtofour) if a is not None]
    if address.teredo:
        found.extend(address.teredo)
    if address in _NAT64 or address in _NAT64_LOCAL or int(address) >> 32 == 0:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def _internal_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if address in _METADATA_ADDRESSES or not address.is_global or address.is_multicast:
        return True
    if isinstance(address, ipaddress.IPv6Address):
        return any(_internal_address(inner) for inner in _embedded_ipv4(address))
    return False


def _host_matches(host: str, pattern: _HostMatcher | None) -> bool:
    return pattern is not None and pattern.match(host)


def _normal_host(raw: str) -> str:
    if raw.isascii() and "%" not in raw:
        return raw.lower().rstrip(".")
    host = compatibility_form(decode_fully(raw)).translate(_IDEOGRAPHIC_DOTS).lower()
    return host.rstrip(".")


def check_url(value: object, rules: UrlRules) -> GuardResult:
    if not isinstance(value, str):
        return refuse("a URL must be a string")
    plain = _PLAIN_URL.fullmatch(value)
    if plain is not None:
        scheme = plain.group(1).lower()
        if scheme not in rules.schemes:
            return refuse("the URL scheme is not allowed")
        port_text = plain.group(3)
        port = int(port_text) if port_text else None
        if port is not None and port > 65535:
            return refuse("the URL is malformed")
        return _judged(plain.group(2).lower(), scheme, port, rules)
    parsed = _parse(value, rules)
    if isinstance(parsed, GuardResult):
        return parsed
    scheme, raw_host, port = parsed
    return _judged(_normal_host(raw_host), scheme, port, rules)


_VERDICTS_KEPT = 4096


def _judged(host: str, scheme: str, port: int | None, rules: UrlRules) -> GuardResult:
    verdicts = rules._verdicts
    key = (host, scheme, port)
    verdict = verdicts.get(key)
    if verdict is None:
        verdict = _judge_host(host, scheme, port, rules)
        if len(verdicts) >= _VERDICTS_KEPT:
            verdicts.clear()
        verdicts[key] = verdict
    return verdict


def _parse(value: str, rules: UrlRules) -> tuple[str, str, int | None] | GuardResult:
    """Scheme, raw host and port of any URL, or the refusal of one parsers could read differently."""
    if _UNSAFE.search(value):
        return refuse("the URL contains characters that parsers read differently")
    scheme_match = _SCHEME.match(value)
    if not scheme_match:
        return refuse("the URL has no scheme")
    scheme = scheme_match.group(1).lower()
    if scheme not in rules.schemes:
        return refuse("the URL scheme is not allowed")
    rest = value[scheme_match.end() :]
    if scheme in _SPECIAL_SCHEMES and (not rest.startswith("//") or rest.startswith("///")):
        return refuse("the URL is malformed")
    authority = _AUTHORITY_END.split(rest[2:], 1)[0] if rest.startswith("//") else ""
    if "@" in authority and not rules.allow_userinfo:
        return refuse("the URL carries credentials")
    hostport = authority.rsplit("@", 1)[-1]
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return refuse("the URL is malformed")
        raw_host, port_text = hostport[1:end], hostport[end + 1 :]
        if port_text and not port_text.startswith(":"):
            return refuse("the URL is malformed")
        port_text = port_text[1:]
    else:
        raw_host, _, port_text = hostport.partition(":")
    if port_text and (not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535):
        return refuse("the URL is malformed")
    return scheme, raw_host, int(port_text) if port_text else None


def _judge_host(host: str, scheme: str, port: int | None, rules: UrlRules) -> GuardResult:
    """The checks on a URL's normalised host and port, whichever way they were parsed."""
    if not host:
        return refuse("the URL has no host")
    if rules.allowed_ports and (port or _default_port(scheme)) not in rules.allowed_ports:
        return refuse("the URL port is not allowed")
    if "%" in host or "@" in host or "/" in host or not host.isprintable():
        return refuse("the URL host is malformed")
    deny = rules._deny
    if deny is not None and deny.match(host):
        return refuse("the URL host is denied")
    address = _as_address(host)
    if address is False:
        return refuse("the URL host is malformed")
    if not rules.allow_private:
        if address is not None and _internal_address(address):
            return refuse("the URL points at an internal address")
        internal = rules._internal
        if address is None and internal is not None and internal.match(host):
            return refuse("the URL points at an internal host")
    if rules.allow_hosts and not _host_matches(host, rules._allow):
        return refuse("the URL host is not in the allowed list")
    return PASS


def _default_port(scheme: str) -> int | None:
    return {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}.get(scheme)


def _as_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None | bool:
    """The IP address ``host`` spells, None for a DNS name, False for a malformed numeric host."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return False
    if _looks_numeric(host):
        address = parse_ipv4_loose(host)
        return address if address is not None else False
    if not _HOST_CHARACTERS.fullmatch(host):
        return False
    return None
