"""Client certificates: the names of a certificate a real TLS handshake on 127.0.0.1 verified, and how
``auth.client_certificates`` maps them to identities."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bastion.auth.base import AuthFailure, Credentials
from bastion.auth.mtls import ClientCertificateMethod, certificate_names, parse_mapping
from bastion.transport.listener import verified_certificate


def uri_certificate(authority: trustme.CA, uri: str, common_name: str) -> tuple[bytes, bytes]:
    """A client certificate with a URI SAN (a SPIFFE ID), which trustme cannot issue, signed by ``authority``:
    (certificate PEM, key PEM)."""
    issuer_key = serialization.load_pem_private_key(authority.private_key_pem.bytes(), None)
    issuer = x509.load_pem_x509_certificate(authority.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(issuer_key, hashes.SHA256()))
    return (certificate.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


async def handshake(authority: trustme.CA, configure_client: Any, tmp_path) -> dict[str, Any] | None:
    """The peer certificate the server side of a real TLS connection on 127.0.0.1 verified."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    authority.configure_trust(server_context)
    server_context.verify_mode = ssl.CERT_OPTIONAL
    seen: asyncio.Future = asyncio.get_running_loop().create_future()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.set_result(verified_certificate(writer.transport))
        writer.close()

    server = await asyncio.start_server(accepted, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)
    configure_client(client_context)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
        result = await asyncio.wait_for(seen, 30)
        writer.close()
        return result
    finally:
        server.close()


async def test_the_names_of_a_verified_certificate(tmp_path) -> None:
    authority = trustme.CA()
    alice = authority.issue_cert("alice@example.com", "agent.example.com", common_name="alice-laptop")
    seen = await handshake(authority, alice.configure_cert, tmp_path)
    assert seen is not None
    assert certificate_names(seen) == [("cn", "alice-laptop"), ("email", "alice@example.com"),
                                       ("dns", "agent.example.com")]
    pem, key = uri_certificate(authority, "spiffe://example.org/ns/agents/ci", "ci")
    (tmp_path / "ci.pem").write_bytes(pem)
    (tmp_path / "ci.key").write_bytes(key)
    seen = await handshake(authority, lambda c: c.load_cert_chain(tmp_path / "ci.pem", tmp_path / "ci.key"),
                           tmp_path)
    assert ("uri", "spiffe://example.org/ns/agents/ci") in certificate_names(seen)
    # no certificate: nothing verified, so nothing for this method to decide
    assert await handshake(authority, lambda c: None, tmp_path) is None


def credentials(certificate: dict[str, Any] | None) -> Credentials:
    return Credentials({}, "mcp", "127.0.0.1", certificate)


CERTIFICATE = {"subject": ((("organizationName", "Example"),), (("commonName", "build-agent"),)),
               "subjectAltName": (("email", "Alice@Example.com"), ("DNS", "Agent.Example.com"),
                                  ("URI", "spiffe://example.org/ns/agents/ci"), ("IP Address", "10.0.0.1"))}


@pytest.mark.parametrize("key, name", [("cn:build-agent", "ci"), ("email:alice@example.com", "alice"),
                                       ("uri:spiffe://example.org/ns/agents/ci", "agents"),
                                       ("DNS:agent.example.com", "agent")])
async def test_each_kind_of_name_maps_to_an_identity(key, name) -> None:
    method = ClientCertificateMethod.from_config({key: name})
    assert method.presented(credentials(CERTIFICATE))
    identity = await method.authenticate(credentials(CERTIFICATE))
    assert (identity.name, identity.authenticated_by, identity.groups) == (name, "mtls", ())


async def test_a_mapping_may_give_groups() -> None:
    method = ClientCertificateMethod.from_config({"cn:build-agent": {"name": "ci", "groups": ["ops", "ci"]}})
    identity = await method.authenticate(credentials(CERTIFICATE))
    assert (identity.name, identity.groups, identity.authenticated_by) == ("ci", ("ops", "ci"), "mtls")


def test_the_configuration_takes_a_name_or_a_table() -> None:
    from bastion.auth.config import AuthConfig

    config = AuthConfig(client_certificates={"cn:a": "alice", "email:b@example.com": {"name": "bob", "groups": ["x"]}})
    method = ClientCertificateMethod.from_config(config.client_certificates)
    assert method.mapping[("email", "b@example.com")].groups == ("x",)
    with pytest.raises(ValueError, match="cn:NAME"):
        AuthConfig(client_certificates={"a": "alice"})
    with pytest.raises(ValueError):
        AuthConfig(client_certificates={"cn:a": {"name": "alice", "group": ["typo"]}})


async def test_a_name_matches_only_as_its_own_kind() -> None:
    # a DNS name of one certificate never passes for another's common name
    method = ClientCertificateMethod.from_config({"cn:agent.example.com": "admin", "dns:build-agent": "admin"})
    with pytest.raises(AuthFailure) as refused:
        await method.authenticate(credentials(CERTIFICATE))
    assert refused.value.status == 403 and "auth.client_certificates" in refused.value.message
    assert not method.presented(credentials(None)) and not method.presented(credentials({}))
    case = ClientCertificateMethod.from_config({"cn:Build-Agent": "ci"})  # a common name is matched exactly
    with pytest.raises(AuthFailure):
        await case.authenticate(credentials(CERTIFICATE))


async def test_a_certificate_two_entries_claim_is_refused() -> None:
    method = ClientCertificateMethod.from_config({"cn:build-agent": "ci", "email:alice@example.com": "alice"})
    with pytest.raises(AuthFailure) as refused:
        await method.authenticate(credentials(CERTIFICATE))
    assert refused.value.status == 403 and "more than one identity" in refused.value.message
    same = ClientCertificateMethod.from_config({"cn:build-agent": "ci", "uri:spiffe://example.org/ns/agents/ci": "ci"})
    assert (await same.authenticate(credentials(CERTIFICATE))).name == "ci"


@pytest.mark.parametrize("key", ["build-agent", "ip:10.0.0.1", "cn:", "subject:x"])
def test_a_mapping_says_which_name_it_matches(key) -> None:
    with pytest.raises(ValueError, match="cn:NAME"):
        parse_mapping({key: "ci"})
    with pytest.raises(ValueError, match="non-empty"):
        parse_mapping({"cn:x": " "})


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_every_request_of_a_connection_carries_its_peer_certificate(tmp_path, parser) -> None:
    import json

    import httpx2
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from bastion.transport.listener import PEER_CERTIFICATE, PeerCertificate, QuietServer, listen

    async def app(scope, receive, send) -> None:  # says which certificate names the request came with
        if scope["type"] != "http":
            return
        names = certificate_names(scope[PEER_CERTIFICATE]) if PEER_CERTIFICATE in scope else None
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(names).encode()})

    authority = trustme.CA()
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    base = HttpToolsProtocol if parser == "httptools" else H11Protocol
    sock = listen("127.0.0.1", 0)
    server = QuietServer(uvicorn.Config(app, http=type("Protocol", (PeerCertificate, base), {}), loop="none",
                                        lifespan="off", log_config=None, ssl_certfile=str(tmp_path / "server.pem"),
                                        ssl_ca_certs=str(tmp_path / "ca.pem"), ssl_cert_reqs=ssl.CERT_OPTIONAL))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    url = f"https://127.0.0.1:{sock.getsockname()[1]}/"
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        for certificate, expected in ((authority.issue_cert("alice@example.com", common_name="alice"),
                                       [["cn", "alice"], ["email", "alice@example.com"]]), (None, None)):
            context = ssl.create_default_context()
            authority.configure_trust(context)
            if certificate is not None:
                certificate.configure_cert(context)
            async with httpx2.AsyncClient(verify=context, timeout=30) as client:
                for _ in range(3):  # one kept-alive connection, several requests
                    assert (await client.get(url)).json() == expected
    finally:
        server.should_exit = True
        await serving
