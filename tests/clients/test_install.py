"""``bastion client install`` points a client's file at Bastion; ``uninstall`` puts it back byte for byte."""

from __future__ import annotations

import json
import tomllib

import pytest

from bastion.jsonc import parse_jsonc
from tests.clients.conftest import BASTION, claude_desktop_file

# Written by hand, as people do: two-space indents, a key order and spacing json.dumps would not reproduce.
CURSOR_FILE = """{
    "mcpServers" : {
        "files": { "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~/Documents"] }
    },
    "theme": "dark"
}"""


def test_install_then_uninstall_restores_the_file_byte_for_byte(machine):
    client_file = machine.home / ".cursor" / "mcp.json"
    client_file.parent.mkdir(parents=True)
    client_file.write_text(CURSOR_FILE)
    original = client_file.read_bytes()

    installed = machine.bastion("client", "install", "cursor")
    assert installed.returncode == 0, installed.stderr
    configuration = machine.bastion_toml
    # The Bastion configuration did not exist: the client's servers were imported into it, and reviewed.
    assert "files" in tomllib.loads(configuration.read_text())["servers"]
    assert "writes:   ~/Documents" in installed.stdout
    pointed = json.loads(client_file.read_text())
    assert pointed["mcpServers"] == {"bastion": {"command": BASTION, "args": ["run", str(configuration)]}}
    assert pointed["theme"] == "dark"  # the rest of the file is the client's and stays
    backups = list(client_file.parent.glob("mcp.json.bastion-backup-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == original

    again = machine.bastion("client", "install", "cursor")
    assert again.returncode == 2 and "already pointed at Bastion" in again.stderr

    removed = machine.bastion("client", "uninstall", "cursor")
    assert removed.returncode == 0, removed.stderr
    assert client_file.read_bytes() == original
    assert "restored" in removed.stderr

    nothing = machine.bastion("client", "uninstall", "cursor")
    assert nothing.returncode == 2 and "nothing to undo" in nothing.stderr


def test_the_entry_install_writes_starts_bastion_on_that_configuration(machine):
    machine.write_json(".config/Claude/claude_desktop_config.json", claude_desktop_file(machine))
    assert machine.bastion("client", "install", "claude-desktop").returncode == 0
    entry = json.loads((machine.config_home / "Claude" / "claude_desktop_config.json").read_text())
    command = [entry["mcpServers"]["bastion"]["command"], *entry["mcpServers"]["bastion"]["args"]]
    assert command[1] == "run"
    checked = machine.bastion("check", command[2])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_uninstall_refuses_a_file_changed_since_install_unless_forced(machine):
    client_file = machine.write_json(".config/Claude/claude_desktop_config.json", claude_desktop_file(machine))
    original = client_file.read_bytes()
    assert machine.bastion("client", "install", "claude-desktop").returncode == 0
    client_file.write_text(client_file.read_text().replace('"bastion"', '"bastion-renamed"'))
    changed = client_file.read_bytes()

    refused = machine.bastion("client", "uninstall", "claude-desktop")
    assert refused.returncode == 2
    assert "changed since install" in refused.stderr and "--force" in refused.stderr
    assert client_file.read_bytes() == changed

    forced = machine.bastion("client", "uninstall", "claude-desktop", "--force")
    assert forced.returncode == 0, forced.stderr
    assert client_file.read_bytes() == original


def test_install_with_a_given_configuration_keeps_claude_codes_other_keys(machine, tmp_path):
    claude_json = machine.write_json(".claude.json", {
        "numStartups": 3, "mcpServers": {"old": {"command": "npx", "args": ["-y", "old-mcp"]}},
        "projects": {"/srv/app": {"mcpServers": {"local": {"command": "npx", "args": ["x"]}}}}})
    original = claude_json.read_bytes()
    mine = tmp_path / "mine.toml"
    mine.write_text('[servers.time]\ncommand = "mcp-server-time"\n')
    done = machine.bastion("client", "install", "claude-code", "--config", str(mine))
    assert done.returncode == 0, done.stderr
    data = json.loads(claude_json.read_text())
    assert data["mcpServers"] == {"bastion": {"command": BASTION, "args": ["run", str(mine)]}}
    assert data["numStartups"] == 3 and "local" in data["projects"]["/srv/app"]["mcpServers"]
    assert "still start directly" in done.stderr
    assert "no server named old" in done.stderr  # it stops starting: said, not silently dropped
    assert mine.read_text() == '[servers.time]\ncommand = "mcp-server-time"\n'  # given: used as it is
    assert machine.bastion("client", "uninstall", "claude-code").returncode == 0
    assert claude_json.read_bytes() == original


def test_vscode_gets_a_typed_servers_entry_and_a_missing_file_is_created_then_removed(machine, tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[servers.time]\ncommand = "mcp-server-time"\n')
    vscode_file = machine.config_home / "Code" / "User" / "mcp.json"
    assert machine.bastion("client", "install", "vscode", "--config", str(mine)).returncode == 0
    assert json.loads(vscode_file.read_text())["servers"]["bastion"]["type"] == "stdio"
    removed = machine.bastion("client", "uninstall", "vscode")
    assert removed.returncode == 0 and not vscode_file.exists()


@pytest.mark.parametrize("client", ["claude-desktop", "windsurf"])
def test_install_without_servers_or_configuration_says_what_to_do(machine, client):
    done = machine.bastion("client", "install", client)
    assert done.returncode == 2 and "--config" in done.stderr


def test_a_file_the_client_rewrote_outside_its_servers_gets_its_servers_back_and_keeps_the_rest(machine, tmp_path):
    claude_json = machine.write_json(".claude.json", {
        "numStartups": 3, "mcpServers": {"old": {"command": "npx", "args": ["-y", "old-mcp"]}}})
    mine = tmp_path / "mine.toml"
    mine.write_text('[servers.old]\ncommand = "npx"\nargs = ["-y", "old-mcp"]\n')
    assert machine.bastion("client", "install", "claude-code", "--config", str(mine)).returncode == 0
    # Claude Code counts its starts in the same file
    data = json.loads(claude_json.read_text())
    claude_json.write_text(json.dumps({**data, "numStartups": 4}))

    done = machine.bastion("client", "uninstall", "claude-code")
    assert done.returncode == 0, done.stderr
    assert json.loads(claude_json.read_text()) == {
        "numStartups": 4, "mcpServers": {"old": {"command": "npx", "args": ["-y", "old-mcp"]}}}
    assert "the rest kept as it is now" in done.stderr


def test_install_refuses_a_configuration_that_does_not_load(machine, tmp_path):
    client_file = machine.write_json(".cursor/mcp.json", {"mcpServers": {"a": {"command": "npx"}}})
    before = client_file.read_bytes()
    broken = tmp_path / "broken.toml"
    broken.write_text("[servers.a]\ncomand = 'x'\n")
    done = machine.bastion("client", "install", "cursor", "--config", str(broken))
    assert done.returncode == 2 and "comand" in done.stderr and "nothing was changed" in done.stderr
    assert client_file.read_bytes() == before and not list(client_file.parent.glob("*.bastion-backup-*"))


# Cursor's file as the issue met it: local servers and one remote (url) server with a header.
CURSOR_WITH_REMOTE = """{
  "mcpServers": {
    "files": { "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~/Documents"] },
    "linear": { "url": "https://mcp.linear.app/mcp", "headers": { "Authorization": "Bearer ${env:LINEAR_TOKEN}" } }
  }
}"""

# VS Code's, as it writes it: comments, a `servers` key, a `type` on every entry.
VSCODE_WITH_REMOTE = """// MCP servers of this user
{
  "servers": {
    "files": { "type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~/Documents"] },
    /* reached over HTTP */
    "github": { "type": "http", "url": "https://api.githubcopilot.com/mcp/", "headers": { "X-Team": "core" } },
  },
  "inputs": []
}"""


@pytest.mark.parametrize("client, place, text, remote", [
    ("cursor", (".cursor", "mcp.json"), CURSOR_WITH_REMOTE, "linear"),
    ("vscode", ("CONFIG", "Code", "User", "mcp.json"), VSCODE_WITH_REMOTE, "github"),
])
def test_install_keeps_remote_servers_where_import_says_they_stay(machine, client, place, text, remote):
    folder = machine.config_home if place[0] == "CONFIG" else machine.home / place[0]
    client_file = folder.joinpath(*place[1:])
    client_file.parent.mkdir(parents=True, exist_ok=True)
    client_file.write_text(text)
    original = client_file.read_bytes()
    before = machine.bastion("import", str(client_file), "--dry-run")
    said = before.stdout + before.stderr
    assert f"'{remote}'" in said and "keeps reaching it directly" in said and "client install` leaves it" in said

    installed = machine.bastion("client", "install", client)
    assert installed.returncode == 0, installed.stderr
    key = "servers" if client == "vscode" else "mcpServers"
    servers = json.loads(client_file.read_text())[key]
    assert servers[remote] == parse_jsonc(text)[key][remote]  # as it was, headers and all
    assert set(servers) == {"bastion", remote}  # the local server now runs behind Bastion
    assert f"kept in {client_file}: the remote server {remote}" in installed.stderr
    assert remote not in tomllib.loads(machine.bastion_toml.read_text())["servers"]

    removed = machine.bastion("client", "uninstall", client)
    assert removed.returncode == 0, removed.stderr
    assert client_file.read_bytes() == original


def test_install_of_a_file_of_remote_servers_only_changes_nothing_and_says_why(machine):
    client_file = machine.write_json(".cursor/mcp.json", {"mcpServers": {"linear": {"url": "https://mcp.linear.app/mcp"}}})
    original = client_file.read_bytes()
    done = machine.bastion("client", "install", "cursor")
    assert done.returncode == 1 and "every server of" in done.stderr and "nothing was changed" in done.stderr
    assert client_file.read_bytes() == original and not machine.bastion_toml.exists()
