"""Plain-text remotes: an http:// server at a host that is not loopback is refused at load unless allowed.

Every foreign host here is in the reserved .invalid TLD (RFC 2606) or a documentation address, so even a
regression that connected could not reach a real host; the refusal is asserted to come from validation.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bastion.clients.discovery import FoundServer
from bastion.clients.importer import import_servers
from bastion.config import ConfigError, load_config
from bastion.diagnostics import diagnose
from bastion.plaintext import is_plaintext_remote
from tests.support import BASTION

FOREIGN = "http://mcp.example.invalid/mcp"


def _write(tmp_path: Path, data: dict, name: str = "bastion.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(path, log_notes=False)
    return str(raised.value)


def test_a_plain_text_remote_is_refused_naming_the_file_the_key_and_the_fix(tmp_path):
    path = _write(tmp_path, {"servers": {"docs": {"url": FOREIGN}}})
    message = _refused(path)
    assert str(path) in message and "servers.docs.url" in message
    assert "not loopback" in message and "use an https:// URL" in message and "allow_plaintext" in message


def test_the_same_in_toml(tmp_path):
    path = tmp_path / "bastion.toml"
    path.write_text(f'[servers.docs]\nurl = "{FOREIGN}"\nheaders = {{ Authorization = "Bearer t" }}\n')
    message = _refused(path)
    assert "servers.docs.url" in message and "allow_plaintext" in message


@pytest.mark.parametrize("entry", [
    {"url": FOREIGN},                                       # Cursor, Claude Desktop
    {"type": "http", "url": FOREIGN},                       # Claude Code, VS Code
    {"type": "sse", "url": "http://sse.example.invalid/sse"},
    {"serverUrl": "http://windsurf.example.invalid/mcp"},  # Windsurf
])
def test_each_clients_remote_form_is_refused_the_same_way(tmp_path, entry):
    message = _refused(_write(tmp_path, {"mcpServers": {"remote": entry}}, name="mcp.json"))
    assert "mcpServers.remote.url" in message and "allow_plaintext" in message


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/mcp", "http://127.8.9.10/mcp", "http://localhost:3000/mcp", "http://LOCALHOST/mcp",
    "http://[::1]:9000/mcp", "http://[::ffff:127.0.0.1]/mcp",
    "https://mcp.example.invalid/mcp", "HTTPS://mcp.example.invalid/mcp", "https://192.0.2.1/mcp",
])
def test_loopback_over_http_and_anything_over_https_need_nothing(tmp_path, url):
    config = load_config(_write(tmp_path, {"servers": {"a": {"url": url}}}), log_notes=False)
    assert config.servers["a"].url == url and config.servers["a"].allow_plaintext is False


@pytest.mark.parametrize("url", [
    "HTTP://mcp.example.invalid/mcp",
    "http://192.0.2.1/mcp", "http://10.0.0.1/mcp", "http://[2001:db8::1]/mcp", "http://[::ffff:192.0.2.1]/mcp",
    # judged by the literal host, never resolved: names that merely look like loopback are not
    "http://127.0.0.1.example.invalid/mcp", "http://localhost.example.invalid/mcp", "http://127.example.invalid/",
    "http://127.1/mcp", "http://0x7f.0.0.1/mcp", "http://localhost@mcp.example.invalid/mcp",
])
def test_what_is_not_literally_loopback_is_plain_text(url):
    assert is_plaintext_remote(url)


def test_allow_plaintext_lets_it_load_and_check_warns_what_crosses(tmp_path):
    path = _write(tmp_path, {"servers": {"docs": {"url": FOREIGN, "allow_plaintext": True,
                                                  "headers": {"Authorization": "Bearer s3cr3t"}}}})
    config = load_config(path, log_notes=False)
    assert config.servers["docs"].allow_plaintext is True
    said = [(f.level, f.where, f.message) for f in diagnose(config)]
    assert any(level == "warning" and where == "servers.docs.allow_plaintext" and "Authorization" in message
               and "unencrypted" in message for level, where, message in said)
    assert not any("s3cr3t" in message for _, _, message in said)


def test_allow_plaintext_in_a_client_file_entry(tmp_path):
    path = _write(tmp_path, {"mcpServers": {"remote": {"type": "http", "url": FOREIGN, "allow_plaintext": True}}},
                  name="mcp.json")
    assert load_config(path, log_notes=False).servers["remote"].allow_plaintext is True


def test_allow_plaintext_where_it_is_not_needed_is_a_warning(tmp_path):
    config = load_config(_write(tmp_path, {"servers": {"a": {"url": "https://a.example.invalid/mcp",
                                                              "allow_plaintext": True}}}), log_notes=False)
    assert ("warning", "servers.a.allow_plaintext") in [(f.level, f.where) for f in diagnose(config)]


@pytest.mark.parametrize("entry,message", [
    ({"url": FOREIGN, "allow_plaintext": "yes"}, "allow_plaintext"),
    ({"url": FOREIGN, "allow_plaintext": 1}, "allow_plaintext"),
    ({"command": "x", "allow_plaintext": True}, "for remote (url) servers only"),
])
def test_allow_plaintext_is_validated(tmp_path, entry, message):
    assert message in _refused(_write(tmp_path, {"servers": {"a": entry}}))


def test_bastion_check_exits_2_with_the_message(tmp_path):
    path = _write(tmp_path, {"servers": {"docs": {"url": FOREIGN}}})
    done = subprocess.run([BASTION, "check", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "servers.docs.url" in done.stderr and "allow_plaintext" in done.stderr
    as_json = subprocess.run([BASTION, "check", "--json", str(path)], capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 2
    [finding] = json.loads(as_json.stdout)["findings"]
    assert finding["where"] == "servers.docs.url" and "allow_plaintext" in finding["fix"]


def test_bastion_run_refuses_a_plain_text_remote_at_start(tmp_path):
    path = _write(tmp_path, {"servers": {"docs": {"url": FOREIGN}}})
    done = subprocess.run([BASTION, "run", str(path)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    # The validation's own words: the configuration was refused as it was read, before any gateway was built.
    assert f"{path}: invalid configuration" in done.stderr and "servers.docs.url" in done.stderr
    assert "allow_plaintext" in done.stderr and done.stdout == ""


def test_import_says_a_plain_text_remote_needs_the_allowance(tmp_path):
    def found(name: str, entry: dict) -> FoundServer:
        return FoundServer(name, entry, "Cursor (~/.cursor/mcp.json)", tmp_path / "mcp.json", tmp_path)

    result = import_servers([found("plain", {"url": FOREIGN}), found("local", {"url": "http://127.0.0.1:1/mcp"}),
                             found("tls", {"serverUrl": "https://a.example.invalid/mcp"})], home=tmp_path)
    plain, local, tls = result.skipped
    assert "'plain'" in plain and "allow_plaintext = true" in plain and FOREIGN in plain
    assert "allow_plaintext" not in local and "allow_plaintext" not in tls
