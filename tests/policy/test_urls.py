"""URL guard: internal addresses refused in every spelling; ordinary public URLs admitted. No traffic is sent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.policy.decision import GuardResult
from bastion.policy.guards import UrlRules, check_url, urls
from bastion.policy.guards.urls import parse_ipv4_loose
from tests.properties import PROPERTY

OPEN = UrlRules()

INTERNAL = [
    "http://127.0.0.1/", "http://2130706433/", "http://0x7f.1/", "http://0177.0.0.1/", "http://127.1",
    "http://0x7f000001/", "http://017700000001/", "http://0x7f.0x0.0x0.0x1/", "http://127.000.000.001/",
    "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:127.0.0.1]/",
    "http://[::127.0.0.1]/", "http://[2002:7f00:1::]/", "http://[64:ff9b::7f00:1]/", "http://[::]/",
    "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
    "http://169.254.169.254/latest/meta-data/", "http://[::ffff:a9fe:a9fe]/", "http://[fd00:ec2::254]/",
    "http://100.100.100.200/", "http://metadata.google.internal/", "http://metadata/",
    "http://localhost:8080/", "http://LOCALHOST./", "http://foo.localhost/", "http://printer.local/",
    "http://10.0.0.1/", "http://192.168.1.1/", "http://172.16.0.1/", "http://100.64.0.1/", "http://0.0.0.0/",
    "http://0/", "http://224.0.0.1/", "http://[ff02::1]/", "http://[fe80::1%25eth0]/", "http://[fc00::1]/",
    "http://%31%32%37.0.0.1/", "http://１２７.０.０.１/", "http://127。0。0。1/", "http://192.168.0.1.",
    "http://127.0.0.1.nip.io/", "http://169.254.169.254.xip.io/", "http://app.localtest.me/",
]

MALFORMED_OR_SMUGGLED = [
    "http://evil.com@127.0.0.1/", "http://127.0.0.1\\@example.com/", "http:127.0.0.1/", "http:/127.0.0.1/",
    "http:///127.0.0.1/", " http://example.com/", "http://exa mple.com/", "http://example.com\t/",
    "http://127.0.0.1:80@example.com/", "http://1.2.3.4.5/", "http://256.1.1.1/", "http://example.com%2f@127.0.0.1/",
]

WRONG_SCHEME = ["file:///etc/passwd", "gopher://example.com:25/", "javascript:alert(1)", "ftp://example.com/",
                "dict://example.com:11211/", "data:text/plain,hi", "example.com/path"]

BENIGN = [
    "https://example.com/", "https://docs.python.org/3/library/ipaddress.html?q=a&b=c#frag",
    "http://example.com:8080/x", "https://93.184.216.34/", "https://xn--bcher-kva.example/",
    "https://bücher.example/pfad?x=ü", "https://api.github.com/repos/a/b", "https://example.com/a%20b",
    "https://[2606:4700::1111]/", "https://sub.domain.example.co.uk/path/to/file.tar.gz",
    "https://example.com/search?q=127.0.0.1", "https://example.com/?next=http://localhost/",
    "https://127-0-0-1.example.com/", "https://8.8.8.8/", "https://local.example.com/",
]


@pytest.mark.parametrize("url", INTERNAL)
def test_internal_addresses_refused(url: str) -> None:
    assert not check_url(url, OPEN).ok


@pytest.mark.parametrize("url", MALFORMED_OR_SMUGGLED + WRONG_SCHEME)
def test_smuggling_and_schemes_refused(url: str) -> None:
    assert not check_url(url, OPEN).ok


@pytest.mark.parametrize("url", BENIGN)
def test_public_urls_admitted(url: str) -> None:
    assert check_url(url, OPEN).ok, check_url(url, OPEN).reason


def test_allow_and_deny_lists() -> None:
    rules = UrlRules(schemes=("https",), allow_hosts=("example.com", "*.example.com"), deny_hosts=("bad.example.com",))
    assert check_url("https://example.com/", rules).ok
    assert check_url("https://api.example.com/v1", rules).ok
    assert check_url("https://bad.example.com/", rules).reason == "the URL host is denied"
    assert check_url("https://example.com.evil.net/", rules).reason == "the URL host is not in the allowed list"
    assert check_url("https://evilexample.com/", rules).reason == "the URL host is not in the allowed list"
    assert check_url("http://example.com/", rules).reason == "the URL scheme is not allowed"
    # An allowlist never admits an internal address spelled as a number.
    assert not check_url("https://2130706433/", UrlRules(allow_hosts=("*",))).ok


def test_private_addresses_admitted_only_when_configured() -> None:
    assert check_url("http://127.0.0.1:8000/", UrlRules(allow_private=True)).ok


def test_ports() -> None:
    rules = UrlRules(allowed_ports=(443,))
    assert check_url("https://example.com/", rules).ok
    assert not check_url("https://example.com:8443/", rules).ok


@pytest.mark.parametrize(
    "text, address",
    [("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("0177.0.0.01", "127.0.0.1"), ("10.1", "10.0.0.1"),
     ("192.168.257", "192.168.1.1"), ("1.2.3.4", "1.2.3.4")],
)
def test_ipv4_reads_like_inet_aton(text: str, address: str) -> None:
    assert str(parse_ipv4_loose(text)) == address


def _full_parse_verdict(url: str, rules: UrlRules) -> str | None:
    """The verdict of the full parser alone, bypassing the plain-URL shortcut."""
    parsed = urls._parse(url, rules)
    if isinstance(parsed, GuardResult):
        return parsed.reason
    scheme, raw_host, port = parsed
    return urls._judge_host(urls._normal_host(raw_host), scheme, port, rules).reason


SHORTCUT_RULES = [
    OPEN,
    UrlRules(schemes=("https",), deny_hosts=("*.evil.example", "bad.example.com")),
    UrlRules(allow_hosts=("example.com", "*.example.com"), allowed_ports=(443, 8080)),
    UrlRules(allow_private=True),
]
LABELS = st.sampled_from(
    ["example", "COM", "127", "0x7f", "0177", "1", "0", "255", "256", "localhost", "nip", "io", "evil", "internal",
     "xn--bcher-kva", "169", "254", "a-b", "-x", "", "ü", "%31", "１", "metadata", "local", "lan", "bad", "LOCALHOST",
     "Example", "BAD", "Evil"]
)
URLS = st.builds(
    lambda scheme, separator, labels, dots, port, tail: scheme + separator + dots.join(labels) + port + tail,
    st.sampled_from(["http", "https", "HTTPS", "hTTp", "ftp", "x-y+z", "javascript", "", "1http"]),
    st.sampled_from(["://", "://", "://", ":", ":/", ":///", "://user@", "://a:b@", "//"]),
    st.lists(LABELS, min_size=1, max_size=5),
    st.sampled_from([".", ".", ".", ".", "\u3002", ".."]),
    st.sampled_from(["", ":", ":0", ":80", ":443", ":8080", ":65535", ":65536", ":99999", ":123456", ":8x", ".", "."]),
    st.sampled_from(["", "/", "/p?q=1#f", "?x", "#y", "/a b", "/\\x", "/ü", "/%2e%2e/", "@127.0.0.1", "/\x7f"]),
)


@settings(PROPERTY, max_examples=1000)
@given(url=URLS, rules_index=st.integers(0, len(SHORTCUT_RULES) - 1))
def test_plain_url_shortcut_agrees_with_the_full_parser(url: str, rules_index: int) -> None:
    rules = SHORTCUT_RULES[rules_index]
    assert check_url(url, rules).reason == _full_parse_verdict(url, rules), url


@pytest.mark.parametrize("url", INTERNAL + MALFORMED_OR_SMUGGLED + WRONG_SCHEME + BENIGN)
def test_plain_url_shortcut_agrees_on_the_listed_urls(url: str) -> None:
    for rules in SHORTCUT_RULES:
        assert check_url(url, rules).reason == _full_parse_verdict(url, rules)
