"""Static upstream credentials and the configuration of the others: ``${file:PATH}`` secrets files in headers and in
a server's client secret, and the mistakes the configuration refuses with the fix named."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from bastion.config import ConfigError, ServerConfig, load_config
from bastion.variables import Variables, VariableError


def test_a_secrets_file_is_read_without_its_last_line_break(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cr3t-value\n")
    (tmp_path / "crlf").write_text("with-crlf\r\n")
    variables = Variables(tmp_path, tmp_path, {})
    assert variables.expand("Bearer ${file:token}") == "Bearer s3cr3t-value"  # relative: the config's folder
    assert variables.expand(f"${{file:{tmp_path / 'crlf'}}}") == "with-crlf"
    with pytest.raises(VariableError) as missing:
        variables.expand("${file:nope}")
    assert str(tmp_path / "nope") in str(missing.value) and "create" in missing.value.fix


def test_headers_and_client_secrets_in_bastions_file_come_from_secrets_files(tmp_path: Path) -> None:
    (tmp_path / "api-token").write_text("tok-1234\n")
    (tmp_path / "client-secret").write_text("cs-5678\n")
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"policy": "off", "servers": {
        "static": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${file:api-token}"}},
        "oauth": {"url": "https://b.example/mcp", "auth": {
            "type": "client_credentials", "issuer": "https://as.example", "client_id": "bastion",
            "client_secret": "${file:client-secret}", "ca_file": "certs/idp-ca.pem"}},
    }}))
    config = load_config(path)
    assert config.servers["static"].headers["Authorization"] == "Bearer tok-1234"
    assert config.servers["oauth"].auth.client_secret == "cs-5678"
    assert "cs-5678" not in repr(config.servers["oauth"])
    assert config.servers["oauth"].auth.ca_file == str(tmp_path / "certs" / "idp-ca.pem")  # from the file's folder


def test_a_secrets_file_that_is_missing_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"servers": {"oauth": {"url": "https://b.example/mcp", "auth": {
        "type": "client_credentials", "issuer": "https://as.example", "client_id": "bastion",
        "client_secret": "${file:/nonexistent/secret}"}}}}))
    with pytest.raises(ConfigError, match=r"servers\.oauth\.auth\.client_secret"):
        load_config(path)


@pytest.mark.parametrize(("entry", "says"), [
    ({"url": "https://x.example/mcp", "auth": {"type": "token_exchange", "issuer": "https://as", "client_id": "b",
                                                "client_secret": "s"}}, 'scope = "per_identity"'),
    ({"url": "https://x.example/mcp", "auth": {"type": "authorization_code"}}, 'scope = "per_identity"'),
    ({"url": "https://x.example/mcp", "scope": "per_identity", "auth": {"type": "token_exchange",
                                                                        "client_id": "b"}},
     "client_secret (or token_endpoint_auth_method"),
    # the caller's token goes to the token exchange's authorization server: named here, never found from the server
    ({"url": "https://x.example/mcp", "scope": "per_identity", "auth": {"type": "token_exchange", "client_id": "b",
                                                                        "client_secret": "s"}},
     "issuer (or token_endpoint)"),
    ({"command": "server", "auth": {"type": "client_credentials", "issuer": "https://as", "client_id": "b",
                                    "client_secret": "s"}}, "for remote (url) servers only"),
    ({"command": "server", "identity_env": {"TOKEN": "token"}}, 'scope = "per_identity"'),
    ({"url": "https://x.example/mcp", "scope": "per_identity", "identity_env": {"TOKEN": "token"}},
     "for local (command) servers only"),
    ({"url": "https://x.example/mcp", "client_key": "key.pem"}, "client_key needs client_cert"),
    ({"url": "https://x.example/mcp", "headers": {"authorization": "Bearer static"}, "auth": {
        "type": "client_credentials", "issuer": "https://as", "client_id": "b", "client_secret": "s"}},
     "would both set the Authorization header"),
])
def test_credentials_that_cannot_work_are_refused_with_the_fix(entry: dict, says: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        ServerConfig.model_validate(entry)
    assert says in str(refused.value)


def test_per_identity_credentials_are_accepted_where_each_caller_has_an_instance() -> None:
    exchange = ServerConfig.model_validate({"url": "https://x.example/mcp", "scope": "per_identity", "auth": {
        "type": "token_exchange", "issuer": "https://as", "client_id": "b", "client_secret": "s"}})
    assert exchange.auth.type == "token_exchange"
    local = ServerConfig.model_validate({"command": "server", "scope": "per_identity",
                                         "identity_env": {"GITHUB_TOKEN": "github_token"}})
    assert local.identity_env == {"GITHUB_TOKEN": "github_token"}


def test_bastion_check_says_what_a_remote_server_is_sent_and_what_cannot_work(tmp_path: Path) -> None:
    from bastion.diagnostics import diagnose

    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"policy": "off", "servers": {"tickets": {
        "url": "http://tickets.example.com/mcp", "allow_plaintext": True, "scope": "per_identity",
        "client_cert": "missing.pem",
        "auth": {"type": "token_exchange", "issuer": "https://as.example", "client_id": "b",
                 "client_secret": "s3cr3t-in-file"}}}}))
    findings = diagnose(load_config(path, log_notes=False))
    said = [(f.level, f.where, f.message) for f in findings]
    assert any("exchanged for one of its own" in m and "client certificate" in m for _, _, m in said)
    assert ("error", "servers.tickets.client_cert") in [(level, where) for level, where, _ in said]
    assert any(level == "warning" and "unencrypted" in m for level, _, m in said)
    assert not any("s3cr3t-in-file" in f.message + f.fix for f in findings)
