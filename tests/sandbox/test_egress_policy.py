"""The egress decisions as pure functions: allowlist first, then the resolved addresses."""

from __future__ import annotations

import ipaddress

import pytest

from bastion.sandbox.egress_policy import (
    decide_addresses, decide_request, internal_reason, parse_allow_rule, parse_ip_literal,
)


def rules(*entries: str):
    return tuple(parse_allow_rule(entry) for entry in entries)


def ip(text: str):
    return ipaddress.ip_address(text)


# --- parsing allowlist entries -----------------------------------------------------------------

@pytest.mark.parametrize("entry, host, port, wildcard", [
    ("api.example.com:443", "api.example.com", 443, False),
    ("API.Example.COM.:443", "api.example.com", 443, False),
    ("*.example.com:443", "example.com", 443, True),
    ("127.0.0.1:8080", "127.0.0.1", 8080, False),
    ("[::1]:8080", "::1", 8080, False),
])
def test_parse_allow_rule(entry, host, port, wildcard):
    rule = parse_allow_rule(entry)
    assert (rule.host, rule.port, rule.wildcard) == (host, port, wildcard)


@pytest.mark.parametrize("entry", [
    "example.com", "example.com:", "example.com:0", "example.com:65536", "example.com:https", ":443",
    "exa mple.com:443", "*.*.example.com:443", "ex*ample.com:443", "-bad.example.com:443", "bücher.de:443",
    "example.com:\u00b2", "example.com:4\u0663", "example.com:" + "4" * 5000,
])
def test_parse_allow_rule_rejects(entry):
    with pytest.raises(ValueError, match="host:port"):
        parse_allow_rule(entry)


# --- IP literals in every encoding --------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),        # decimal
    ("0x7f000001", "127.0.0.1"),        # hex
    ("0X7F000001", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),        # octal
    ("0177.0000.0000.0001", "127.0.0.1"),
    ("127.1", "127.0.0.1"),             # short form
    ("0x7f.1", "127.0.0.1"),
    ("127.0.0.1.", "127.0.0.1"),        # trailing dot
    ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
    ("2852039166", "169.254.169.254"),
    ("[::1]", "::1"),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
    ("::ffff:7f00:1", "::ffff:127.0.0.1"),
    ("fe80::1%eth0", "fe80::1"),
])
def test_parse_ip_literal_every_encoding(text, expected):
    assert parse_ip_literal(text) == ip(expected)


@pytest.mark.parametrize("text", ["example.com", "cafe.be", "1.2.3.4.5", "localhost", "0x", ""])
def test_parse_ip_literal_leaves_names_alone(text):
    assert parse_ip_literal(text) is None


# --- address classes -----------------------------------------------------------------------------

@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fd12::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("169.254.169.254", "metadata"), ("100.100.100.200", "metadata"), ("fd00:ec2::254", "metadata"),
    ("224.0.0.1", "multicast"), ("239.1.1.1", "multicast"), ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("240.0.0.1", "reserved"), ("100.64.0.1", "address"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "metadata"), ("::ffff:10.0.0.1", "private"),
    ("64:ff9b::7f00:1", "loopback"), ("2002:7f00:1::", "loopback"), ("2002:a00:1::", "private"),
])
def test_internal_addresses_are_named(address, reason):
    found = internal_reason(ip(address))
    assert found is not None and reason in found


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1"])
def test_public_addresses_pass(address):
    assert internal_reason(ip(address)) is None


# --- step 1: the allowlist as written, before any lookup ----------------------------------------

ALLOW = rules("api.example.com:443", "*.cdn.example.net:443", "127.0.0.1:8080", "[::1]:9090", "localhost:8080")


@pytest.mark.parametrize("host, port", [
    ("api.example.com", 443), ("API.EXAMPLE.COM", 443), ("api.example.com.", 443),
    ("a.cdn.example.net", 443), ("a.b.cdn.example.net", 443),
    ("localhost", 8080),
])
def test_names_on_the_allowlist_go_on_to_resolution(host, port):
    decision = decide_request(ALLOW, host, port)
    assert decision.allowed and decision.explicit_ip is None


@pytest.mark.parametrize("host, port", [
    ("api.example.com", 80),            # wrong port
    ("example.com", 443),                # parent of an exact rule
    ("cdn.example.net", 443),            # a wildcard covers subdomains only
    ("evilcdn.example.net", 443),        # suffix without the dot
    ("api.example.com.evil.org", 443),   # allowed name as a prefix
    ("notapi.example.com", 443),
    ("169.254.169.254", 80),             # metadata, by IP
    ("metadata.google.internal", 80),
    ("127.0.0.1", 8081),                 # allowlisted IP, other port
    ("127.0.0.2", 8080),                 # other loopback IP
    ("10.0.0.1", 443),
    ("exa mple.com", 443), ("", 443), ("api.example.com", 0), ("api.example.com", 70000),
    ("1.2.3.4.5", 443), ("0x7f.0x0.0x0.0x1.0x5", 443),  # numeric-looking, not parseable: never resolved
])
def test_everything_else_is_refused_before_resolution(host, port):
    assert not decide_request(ALLOW, host, port).allowed


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1",
                                  "::ffff:127.0.0.1", "[::ffff:7f00:1]"])
def test_an_explicit_ip_matches_in_any_encoding(host):
    decision = decide_request(ALLOW, host, 8080)
    assert decision.allowed and decision.explicit_ip is not None


@pytest.mark.parametrize("host", ["2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "::ffff:169.254.169.254",
                                  "169.254.169.254"])
def test_metadata_in_any_encoding_is_refused(host):
    everything_named = rules("api.example.com:80", "*.example.com:80")
    assert not decide_request(everything_named, host, 80).allowed


def test_explicit_ipv6_rule():
    assert decide_request(ALLOW, "::1", 9090).allowed
    assert decide_request(ALLOW, "[::1]", 9090).allowed
    assert not decide_request(ALLOW, "::1", 8080).allowed


# --- step 2: after resolving an allowed name -----------------------------------------------------

def test_resolved_public_addresses_are_allowed():
    assert decide_addresses(ALLOW, 443, [ip("93.184.216.34"), ip("2606:2800::1")]).allowed


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.5", "169.254.169.254", "::1", "::ffff:127.0.0.1",
                                     "fe80::1", "224.0.0.251", "0.0.0.0"])
def test_a_name_resolving_inward_is_refused(address):
    decision = decide_addresses(ALLOW, 443, [ip(address)])
    assert not decision.allowed and address.split("::ffff:")[-1] in decision.reason


def test_one_internal_address_among_public_ones_is_refused():
    """A DNS answer mixing a public and a private address must not get through on the public one."""
    assert not decide_addresses(ALLOW, 443, [ip("93.184.216.34"), ip("10.0.0.1")]).allowed


def test_a_name_resolving_to_an_allowlisted_ip_is_allowed():
    assert decide_addresses(ALLOW, 8080, [ip("127.0.0.1")]).allowed
    assert not decide_addresses(ALLOW, 8081, [ip("127.0.0.1")]).allowed


def test_no_addresses_is_refused():
    assert not decide_addresses(ALLOW, 443, []).allowed


@pytest.mark.parametrize("authority", ["example.com:\u00b2", "example.com:4\u0663", "[::1]:\u00b9",
                                       "example.com:" + "4" * 5000, "example.com:0", "example.com:65536"])
def test_a_proxy_request_whose_port_is_no_port_is_refused_with_400(authority):
    """What a sandboxed server writes after CONNECT: digits int() refuses ("²", Arabic-Indic, over 4,300 of them)
    are a bad request, never an exception in the proxy."""
    from bastion.sandbox.egress import RequestRejected, split_host_port
    with pytest.raises(RequestRejected) as refused:
        split_host_port(authority, 443)
    assert refused.value.status == 400 and "bad port" in refused.value.reason
