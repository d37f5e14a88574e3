"""Plain-text remotes: an ``http://`` server URL is refused unless its host is literally loopback.

The host is judged as written, never resolved: a name that resolves to 127.0.0.1 today may not tomorrow, and a
check that asked DNS at load time would both leak the name and trust whoever answers.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

PLAINTEXT_ERROR = "plaintext_remote"
PLAINTEXT_FIX = ("use an https:// URL; or, if the network path to that host is trusted (a private link, a "
                 "sidecar), set allow_plaintext to true in this server's entry")


def is_loopback_host(host: str) -> bool:
    """Whether ``host``, as written in a URL, is loopback: ``localhost``, 127.0.0.0/8 or ::1 (also as
    ::ffff:127.x.y.z). Decided from the literal text, never by resolving a name: a name that resolves to a loopback
    address is not loopback here, since what it resolves to can change after the configuration is checked."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def is_plaintext_remote(url: str) -> bool:
    """An ``http://`` URL to a host that is not literally loopback: its traffic (and headers, tokens) would cross a
    network unencrypted, and an impostor on the path could answer for the server."""
    if not url.lower().startswith("http://"):
        return False
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return True
    return not is_loopback_host(host)


def plaintext_refusal(url: str) -> str:
    return (f"{url} is plain http:// to a host that is not loopback, so requests, headers and tokens would cross "
            "the network unencrypted and anyone on the path could impersonate the server; refused")
