"""Finding the clients' files and reading the servers out of each format."""

from __future__ import annotations

import pytest

from bastion.clients.discovery import Places, discover, parse_jsonc, read_client_file


def test_jsonc_comments_and_trailing_commas_but_not_slashes_in_strings():
    text = """{
      // a comment with "quotes"
      "url": "https://example.com/a//b", /* block
      comment */ "list": [1, 2, ],
      "escaped": "a \\" // still a string",
    }"""
    assert parse_jsonc(text) == {"url": "https://example.com/a//b", "list": [1, 2], "escaped": 'a " // still a string'}


def test_discover_finds_user_and_project_files_of_every_client(tmp_path):
    home, project = tmp_path / "home", tmp_path / "work" / "app"
    places = Places(home, home / ".config", project)
    files = [home / ".config/Claude/claude_desktop_config.json", home / ".claude.json", project / ".mcp.json",
             home / ".cursor/mcp.json", project / ".cursor/mcp.json", home / ".config/Code/User/mcp.json",
             home / ".config/Code/User/settings.json", project / ".vscode/mcp.json",
             home / ".codeium/windsurf/mcp_config.json"]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    found = discover(places)
    assert [path for _, path in found] == files
    assert [spec.key for spec, _ in found] == ["claude-desktop", "claude-code", "claude-code", "cursor", "cursor",
                                               "vscode", "vscode", "vscode", "windsurf"]


@pytest.mark.parametrize("body, table", [
    ('{"mcpServers": {"a": {"command": "x"}}}', "mcpServers"),
    ('{"servers": {"a": {"type": "stdio", "command": "x"}}}', "servers"),
    ('{"editor.fontSize": 14, "mcp": {"servers": {"a": {"command": "x"}}}}', "mcp.servers"),
    ('{"mcp.servers": {"a": {"command": "x"}}}', "mcp.servers"),
])
def test_each_format_is_read(tmp_path, body, table):
    path = tmp_path / "file.json"
    path.write_text(body)
    read = read_client_file(path, "Some client", tmp_path)
    assert [(server.name, server.table) for server in read.servers] == [("a", table)]
    assert read.problems == []


def test_claude_codes_project_servers_belong_to_their_project(tmp_path):
    path = tmp_path / ".claude.json"
    path.write_text('{"projects": {"/srv/app": {"mcpServers": {"db": {"command": "x"}}}, "/srv/empty": {}}}')
    (server,) = read_client_file(path, "Claude Code", tmp_path).servers
    assert server.workspace.as_posix() == "/srv/app" and "project /srv/app" in server.origin


def test_a_vscode_project_file_belongs_to_the_project_folder(tmp_path):
    path = tmp_path / "app" / ".vscode" / "mcp.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"servers": {"a": {"type": "stdio", "command": "x"}}}')
    (server,) = read_client_file(path, "VS Code", tmp_path).servers
    assert server.workspace == (tmp_path / "app").resolve()


def test_files_without_servers_say_so(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"editor.fontSize": 14}')
    assert "no mcpServers" in read_client_file(path, "VS Code", tmp_path).problems[0]
    path.write_text('{"mcpServers": []}')
    assert "must be an object" in read_client_file(path, "VS Code", tmp_path).problems[0]


def test_a_found_file_without_servers_is_no_problem(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"editor.fontSize": 14}')
    assert read_client_file(path, "VS Code", tmp_path, expect_servers=False).problems == []
