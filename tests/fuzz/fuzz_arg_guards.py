"""The argument guards other than the path guard: the URL (SSRF) guard and the shell guard, on random values.

Oracle: allow or deny only (a ``GuardResult``, its reason a string); a URL allowed under the default rules names no
internal address by any reading of its host (Python's URL parser, ``inet_aton``'s loose numbers, an IPv6 literal
with an IPv4 address inside) and no internal name; a shell word allowed is one word the shell leaves as it is
(``shlex`` reads it back unchanged, and nothing in it is expanded: no tilde where bash expands one)."""

from __future__ import annotations

import ipaddress
import shlex
import socket
from urllib.parse import urlsplit

import atheris

from bastion.policy.decision import GuardResult
from bastion.policy.guards.shell import ShellRules, check_shell_argument
from bastion.policy.guards.urls import UrlRules, check_url

URL_PARTS = ["http://", "https://", "HTTP://", "ftp://", "//", "user:pw@", "@", "127.0.0.1", "0x7f.1", "0177.0.0.1",
             "2130706433", "[::1]", "[::ffff:127.0.0.1]", "[64:ff9b::a00:1]", "169.254.169.254", "localhost",
             "LOCALHOST.", "a.localhost", "example.com", "127.0.0.1.nip.io", ":80", ":65536", "/path", "?q=1", "#f",
             "%2e", "\u3002", "\uff0e", "\\", " ", "\t", "10.0.0.1", "[fe80::1%25eth0]", "0", "0.0.0.0", "."]
SHELL_PARTS = ["git", "main", "-x", "~", "~root", "a=", "PATH=a:", "$(id)", "`id`", ";", "|", "&&", "'", '"', "\\",
               "%0a", "%24", " ", "\t", "*", "{a,b}", "!", "#", "\uff04", "\u00a0", "ls", "-m", "x.txt"]
DEFAULT_URLS = UrlRules()
_SHELL = {mode: ShellRules(mode=mode) for mode in ("argument", "command")}


def _composed(fdp: atheris.FuzzedDataProvider, parts: list[str]) -> str:
    pieces = fdp.ConsumeIntInRange(0, 6)
    return "".join(fdp.PickValueInList(parts) if fdp.ConsumeIntInRange(0, 3) else
                   fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 4)) for _ in range(pieces))


def _internal(host: str) -> bool:
    """Whether any reading of ``host`` is an address that is not global, or a loopback name."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    readings = []
    try:
        readings.append(ipaddress.ip_address(host.split("%")[0] if ":" in host else host))  # an IPv6 scope
    except ValueError:
        pass
    try:
        readings.append(ipaddress.IPv4Address(socket.inet_aton(host)))
    except (OSError, ValueError, UnicodeEncodeError):
        pass
    for address in list(readings):
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            readings.append(address.ipv4_mapped)
    return any(not address.is_global for address in readings)


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    url = _composed(fdp, URL_PARTS)
    verdict = check_url(url, DEFAULT_URLS)
    assert type(verdict) is GuardResult and (verdict.reason is None or isinstance(verdict.reason, str))
    if verdict.ok:
        try:
            host = urlsplit(url).hostname
        except ValueError:
            host = None
        assert host is None or not _internal(host), (url, host)
    mode = fdp.PickValueInList(["argument", "command"])
    word = _composed(fdp, SHELL_PARTS)
    verdict = check_shell_argument(word, _SHELL[mode])
    assert type(verdict) is GuardResult
    if verdict.ok and mode == "argument" and word:
        assert shlex.split(word) == [word], word
        tilde = word.startswith("~") or "=~" in word or ":~" in word
        assert not tilde, word  # bash expands ~ at a word's start and after = or : in an assignment-like word
