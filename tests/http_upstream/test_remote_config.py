"""How remote server entries are read: Bastion's own file and each client's form, and each mistake's message."""

from __future__ import annotations

import json

import pytest

from bastion.config import ConfigError, load_config


def _load(tmp_path, data: dict, name: str = "bastion.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return load_config(path, log_notes=False)


def test_bastions_own_file_reads_url_headers_and_transport_with_env_references(tmp_path, monkeypatch):
    monkeypatch.setenv("BASTION_TEST_TOKEN", "t0ken")
    config = _load(tmp_path, {"servers": {"docs": {
        "url": "https://mcp.example.com/mcp", "transport": "sse", "sse_idle_timeout": 5,
        "headers": {"Authorization": "Bearer ${env:BASTION_TEST_TOKEN}", "X-Plain": "as written"}}}})
    docs = config.servers["docs"]
    assert docs.command is None and docs.is_remote and docs.transport == "sse" and docs.sse_idle_timeout == 5
    assert docs.headers == {"Authorization": "Bearer t0ken", "X-Plain": "as written"}


def test_a_header_naming_an_unset_variable_is_an_error_naming_the_header(tmp_path, monkeypatch):
    monkeypatch.delenv("BASTION_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, {"servers": {"docs": {"url": "https://x.example/mcp",
                                              "headers": {"Authorization": "${env:BASTION_TEST_UNSET}"}}}})
    assert "servers.docs.headers.Authorization" in str(raised.value)
    assert "BASTION_TEST_UNSET is not set" in str(raised.value) and "fix:" in str(raised.value)


@pytest.mark.parametrize("entry,message", [
    ({"command": "x", "url": "https://x.example/mcp"}, "not both"),
    ({"command": "x", "headers": {"A": "b"}}, "for remote (url) servers only"),
    ({"command": "x", "transport": "sse"}, "for remote (url) servers only"),
    ({"url": "ftp://x.example/mcp"}, "must start with http:// or https://"),
    ({"url": "https://x.example/mcp", "headers": {"Bad Name": "v"}}, "not an HTTP header name"),
    ({"url": "https://x.example/mcp", "headers": {"A": "one\r\nX-Smuggled: two"}}, "must be one line"),
    ({"url": "https://x.example/mcp", "transport": "websocket"}, "transport"),
    ({"url": "https://x.example/mcp", "sandbox": "none"}, "for local (command) servers only"),
    ({"url": "https://x.example/mcp", "args": ["--port", "1"]}, "for local (command) servers only"),
])
def test_mistakes_in_a_remote_entry_say_what_to_fix(tmp_path, entry, message):
    with pytest.raises(ConfigError) as raised:
        _load(tmp_path, {"servers": {"a": entry}})
    assert "servers.a" in str(raised.value) and message in str(raised.value)


def test_each_clients_remote_form_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("BASTION_TEST_TOKEN", "t0ken")
    config = _load(tmp_path, {"mcpServers": {
        "cursor": {"url": "https://a.example/mcp", "headers": {"Authorization": "Bearer ${env:BASTION_TEST_TOKEN}"}},
        "claude-code": {"type": "http", "url": "https://b.example/mcp"},
        "old-sse": {"type": "sse", "url": "https://c.example/sse"},
        "windsurf": {"serverUrl": "https://d.example/mcp"},
        "cline": {"url": "https://e.example/sse", "transportType": "sse", "disabled": True},
        "prefixed": {"url": "https://f.example/mcp", "prefix": "", "trust": "trusted", "autoApprove": ["read"]},
    }}, name="mcp.json")
    servers = config.servers
    assert servers["cursor"].headers == {"Authorization": "Bearer t0ken"} and servers["cursor"].transport == "auto"
    assert servers["claude-code"].transport == "streamable-http"
    assert servers["old-sse"].transport == "sse" and servers["old-sse"].url == "https://c.example/sse"
    assert servers["windsurf"].url == "https://d.example/mcp"
    assert servers["cline"].transport == "sse" and servers["cline"].enabled is False
    assert servers["prefixed"].prefix == "" and servers["prefixed"].auto_approve == ["read"]
    assert all(server.command is None for server in servers.values())


def test_vs_code_servers_with_type_http_and_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("BASTION_INPUT_API_KEY", "from-input")
    folder = tmp_path / ".vscode"
    folder.mkdir()
    (folder / "mcp.json").write_text(json.dumps({"inputs": [{"id": "api-key", "type": "promptString"}], "servers": {
        "gh": {"type": "http", "url": "https://api.example/mcp/", "headers": {"Authorization": "Bearer ${input:api-key}"}}}}))
    config = load_config(folder / "mcp.json", log_notes=False)
    assert config.servers["gh"].headers == {"Authorization": "Bearer from-input"}
    assert config.servers["gh"].transport == "streamable-http"


def test_a_client_entry_whose_header_cannot_be_expanded_is_left_out_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("BASTION_TEST_UNSET", raising=False)
    config = _load(tmp_path, {"mcpServers": {
        "bad": {"url": "https://a.example/mcp", "headers": {"X-Key": "${env:BASTION_TEST_UNSET}"}},
        "good": {"url": "https://b.example/mcp"}}}, name="mcp.json")
    assert list(config.servers) == ["good"]
    [note] = [n for n in config.load_notes if n.where == "mcpServers.bad.headers.X-Key"]
    assert note.level == "error" and "BASTION_TEST_UNSET" in note.message


def test_servers_update_and_check_pass_over_a_remote_server(tmp_path):
    import subprocess

    from tests.support import BASTION

    config = tmp_path / "bastion.toml"
    config.write_text('policy = "off"\n[servers.r]\nurl = "https://x.example/mcp"\n')
    update = subprocess.run([BASTION, "servers", "update", "--config", str(config)], capture_output=True, text=True,
                            timeout=60)
    assert "Traceback" not in update.stderr and "no server started by npx" in update.stderr
    check = subprocess.run([BASTION, "check", str(config)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "r: https://x.example/mcp (remote; public key not pinned" in check.stderr
