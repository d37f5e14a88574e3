"""``pinned_public_keys``: a remote server whose certificate carries another key is refused before any request.

The impersonator in these tests holds a certificate from the very CA Bastion trusts for the real server (so
certificate verification alone lets it in): only the pin tells them apart.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import RawClient, write_config

trustme = pytest.importorskip("trustme")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding  # noqa: E402

from bastion.transport.spki import spki_pin  # noqa: E402


class Authority:
    """One CA, its PEM on disk, and certificates for 127.0.0.1 it issues, each with a key of its own."""

    def __init__(self, folder) -> None:
        self.folder = folder
        self.ca = trustme.CA()
        self.ca_file = folder / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.issued = 0

    def issue(self) -> tuple[list[str], str]:
        """``["--tls", cert, key]`` for the remote server, and the pin of the certificate's key."""
        self.issued += 1
        certificate = self.ca.issue_cert("127.0.0.1")
        cert, key = self.folder / f"cert{self.issued}.pem", self.folder / f"key{self.issued}.pem"
        certificate.cert_chain_pems[0].write_to_path(str(cert))
        certificate.private_key_pem.write_to_path(str(key))
        der = x509.load_pem_x509_certificate(certificate.cert_chain_pems[0].bytes()).public_bytes(Encoding.DER)
        return ["--tls", str(cert), str(key)], spki_pin(der)


def _text(answer: dict) -> str:
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def _client(tmp_path, url: str, authority: Authority, pins, **entry) -> RawClient:
    config = write_config(tmp_path / "bastion.json", {"remote": {
        "url": url, "ca_file": str(authority.ca_file), "pinned_public_keys": pins, "startup_timeout": 5, **entry}},
        guardrails={"taint": "off"})
    client = RawClient(config)
    client.initialize()
    return client


def _call(client: RawClient, number: int, text: str) -> dict:
    return client.request(number, "tools/call", {"name": "remote__echo", "arguments": {"text": text}}, timeout=120)


@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.parametrize("http1_only", [False, True], ids=["http2", "http1.1"])
def test_the_pinned_key_is_served_over_either_http_version_and_era(tmp_path, remote_server, http1_only, era):
    authority = Authority(tmp_path)
    tls, pin = authority.issue()
    server = remote_server(*tls, *(["--http1-only"] if http1_only else []))
    client = _client(tmp_path, server.url, authority, pin, era=era)
    try:
        seen = json.loads(_text(client.request(1, "tools/call", {"name": "remote__headers", "arguments": {}},
                                               timeout=120)))
        assert _text(_call(client, 2, "pinned")) == "echo: pinned"
    finally:
        status, stderr = client.close()
    assert seen[":http-version"] == ("1.1" if http1_only else "2"), seen
    assert status == 0 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("http1_only", [False, True], ids=["http2", "http1.1"])
def test_an_impersonator_with_a_certificate_of_the_same_ca_is_refused_before_any_request(
        tmp_path, remote_server, http1_only):
    authority = Authority(tmp_path)
    _, real_pin = authority.issue()
    tls, impostor_pin = authority.issue()
    events = tmp_path / "impostor-events.log"
    server = remote_server(*tls, *(["--http1-only"] if http1_only else []), events=events)
    client = _client(tmp_path, server.url, authority, [real_pin])
    try:
        refused = _call(client, 1, "secret for the real server")
    finally:
        status, stderr = client.close()
    message = refused["error"]["message"]
    assert refused["error"]["code"] == -32001 and "'remote'" in message, refused
    assert impostor_pin in message and real_pin in message, message
    assert impostor_pin in stderr and "refused before any request was sent" in stderr, stderr
    # The impostor saw TLS handshakes and nothing more: no request line reached its application.
    assert not events.exists() or events.read_text() == "", events.read_text()
    assert status == 0 and "Traceback" not in stderr, stderr


def test_an_impersonator_over_http_sse_is_refused_too(tmp_path, remote_server):
    authority = Authority(tmp_path)
    _, real_pin = authority.issue()
    tls, impostor_pin = authority.issue()
    events = tmp_path / "impostor-events.log"
    server = remote_server("--transport", "sse", *tls, events=events)
    client = _client(tmp_path, server.url, authority, real_pin, transport="sse")
    try:
        refused = _call(client, 1, "x")
    finally:
        status, stderr = client.close()
    assert "error" in refused and impostor_pin in refused["error"]["message"], refused
    assert not events.exists() or events.read_text() == "", events.read_text()
    assert status == 0 and "Traceback" not in stderr, stderr


def test_a_list_of_pins_lets_a_rotation_through_and_a_restart_with_an_unpinned_key_is_refused(
        tmp_path, remote_server):
    authority = Authority(tmp_path)
    old_tls, old_pin = authority.issue()
    new_tls, new_pin = authority.issue()
    rogue_tls, rogue_pin = authority.issue()
    server = remote_server(*old_tls)
    client = _client(tmp_path, server.url, authority, [old_pin, new_pin])
    try:
        assert _text(_call(client, 1, "old key")) == "echo: old key"
        server.args = [*new_tls]
        server.restart()  # the rotation: the same port, the next pinned key
        answer = _call(client, 2, "new key")
        for number in range(3, 40):  # the connection the restart dropped is noticed by a call, then reconnected
            if "result" in answer:
                break
            answer = _call(client, number, "new key")
        assert _text(answer) == "echo: new key"
        server.args = [*rogue_tls]
        server.restart()  # a key no pin names, from the trusted CA
        refused = _call(client, 50, "after the restart")
        for number in range(51, 90):
            if rogue_pin in json.dumps(refused):
                break
            assert "result" not in refused, refused
            refused = _call(client, number, "after the restart")
    finally:
        status, stderr = client.close()
    assert "error" in refused and rogue_pin in refused["error"]["message"], refused
    assert status == 0 and "Traceback" not in stderr, stderr


def test_a_pin_that_is_not_one_names_the_key_and_how_to_compute_it(tmp_path):
    config = write_config(tmp_path / "bastion.json", {"remote": {
        "url": "https://example.test/mcp", "pinned_public_keys": ["sha256/abc"]}})
    checked = subprocess.run([sys.executable, "-m", "bastion", "check", str(config)],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode != 0
    assert "pinned_public_keys" in checked.stderr and "openssl" in checked.stderr, checked.stderr


def test_bastion_check_shows_each_remote_servers_pin_status(tmp_path):
    pin = "sha256//" + "A" * 43 + "="
    config = write_config(tmp_path / "bastion.json", {
        "pinned": {"url": "https://one.example.test/mcp", "pinned_public_keys": pin},
        "unpinned": {"url": "https://two.example.test/mcp"}})
    text = subprocess.run([sys.executable, "-m", "bastion", "check", str(config)], capture_output=True, text=True,
                          timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"public key pinned: {pin}" in text.stderr and "public key not pinned" in text.stderr, text.stderr
    as_json = subprocess.run([sys.executable, "-m", "bastion", "check", "--json", str(config)], capture_output=True,
                             text=True, timeout=120)
    servers = json.loads(as_json.stdout)["servers"]
    assert servers["pinned"]["pinned_public_keys"] == [pin] and servers["unpinned"]["pinned_public_keys"] == []


def test_a_pin_on_a_plain_http_url_is_refused_naming_the_key(tmp_path):
    config = write_config(tmp_path / "bastion.json", {"remote": {
        "url": "http://127.0.0.1:9/mcp", "pinned_public_keys": ["sha256//" + "A" * 43 + "="]}})
    checked = subprocess.run([sys.executable, "-m", "bastion", "check", str(config)], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode != 0 and "pinned_public_keys" in checked.stderr and "https://" in checked.stderr


def test_a_remote_entry_pointed_at_another_url_is_held_as_configuration_drift(tmp_path, remote_server, monkeypatch):
    # The same program at another address (a copied entry, an edited url): its definitions are the same, and still
    # not served until a person accepts the new entry.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    first, second = remote_server(), remote_server()

    def call(url: str) -> dict:
        config = write_config(tmp_path / "bastion.json", {"remote": {"url": url}}, guardrails={"taint": "off"})
        client = RawClient(config)
        try:
            client.initialize()
            return _call(client, 1, "drift")
        finally:
            client.close()

    assert _text(call(first.url)) == "echo: drift"
    held = call(second.url)
    assert "configuration entry changed" in held["error"]["message"], held
    assert "url" in held["error"]["message"]
    accepted = subprocess.run([sys.executable, "-m", "bastion", "pins", "accept", "remote"], capture_output=True,
                              text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr
    assert _text(call(second.url)) == "echo: drift"


def test_only_the_leaf_counts_a_pin_of_the_ca_that_issued_it_is_refused(tmp_path, remote_server):
    # A CA's pin would admit every certificate the CA issues, the impersonator's included: it is not a pin here.
    authority = Authority(tmp_path)
    tls, leaf_pin = authority.issue()
    ca_der = x509.load_pem_x509_certificate(authority.ca.cert_pem.bytes()).public_bytes(Encoding.DER)
    server = remote_server(*tls)
    client = _client(tmp_path, server.url, authority, [spki_pin(ca_der)])
    try:
        refused = _call(client, 1, "x")
    finally:
        status, stderr = client.close()
    assert "error" in refused and leaf_pin in refused["error"]["message"], refused
    assert status == 0 and "Traceback" not in stderr, stderr
