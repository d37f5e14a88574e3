"""``bastion import`` on a home full of client files, run as the user runs it."""

from __future__ import annotations

import json
import tomllib

from bastion.config import load_config
from tests.clients.conftest import ROOT, claude_desktop_file

GIT_SERVER = str(ROOT / ".venv" / "bin" / "mcp-server-git")

VSCODE_MCP_JSON = """{
  // VS Code: servers for every workspace
  "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": true}],
  "servers": {
    "memory": {
      "type": "stdio",
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-memory"],
      "env": {"MEMORY_FILE_PATH": "${userHome}/Documents/memory.json"},
    },
    "search": {"type": "stdio", "command": "npx", "args": ["-y", "search-mcp"],
               "env": {"SEARCH_TOKEN": "${env:SEARCH_TOKEN}"}},
    /* a remote server stays with the client */
    "remote": {"type": "http", "url": "https://mcp.example.com/mcp"},
    "asks": {"type": "stdio", "command": "npx", "args": ["-y", "asks-mcp"], "env": {"KEY": "${input:api-key}"}},
  },
}
"""


def home_with_every_client(machine) -> None:
    machine.write_json(".config/Claude/claude_desktop_config.json", claude_desktop_file(machine))
    (machine.config_home / "Code" / "User").mkdir(parents=True)
    (machine.config_home / "Code" / "User" / "mcp.json").write_text(VSCODE_MCP_JSON)
    machine.write_json(".cursor/mcp.json", {"mcpServers": {
        # the same name as Claude Desktop's, another server: renamed
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                                  f"{machine.home}/projects"]},
        # the same server as Claude Desktop's: imported once
        "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                   "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_example"}},
    }})
    machine.write_json(".claude.json", {
        "numStartups": 12,
        "mcpServers": {"git": {"type": "stdio", "command": GIT_SERVER,
                               "args": ["--repository", f"{machine.home}/projects/site"]}},
        "projects": {str(machine.project): {"mcpServers": {
            "site-files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."]}}}},
    })
    machine.write_json(".windsurf-unused", {})
    machine.write_json(".codeium/windsurf/mcp_config.json", {"mcpServers": {
        "notes": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~/Documents"],
                  "disabled": True},
        "drafts": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~/Desktop"],
                   "disabled": "false"}}})


def test_import_finds_every_client_and_writes_one_configuration_check_accepts(machine):
    home_with_every_client(machine)
    done = machine.bastion("import")
    assert done.returncode == 0, done.stderr
    review = done.stdout
    output = machine.bastion_toml
    assert f"wrote {output}" in done.stderr

    checked = machine.bastion("check", str(output))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    written = tomllib.loads(output.read_text())["servers"]
    assert set(written) == {"filesystem", "github", "memory", "search", "filesystem-cursor", "git", "site-files",
                            "notes", "drafts"}
    assert all(server["trust"] == "reviewed" for server in written.values())

    config = load_config(output)
    home = str(machine.home)
    files = config.servers["filesystem"]
    assert files.sandbox.writable == (f"{home}/Documents", f"{home}/Desktop")
    assert home not in files.sandbox.writable  # listed whole in the client file: not granted
    assert config.servers["filesystem-cursor"].sandbox.writable == (f"{home}/projects",)
    assert config.servers["git"].sandbox.writable == (f"{home}/projects/site",)
    assert config.servers["site-files"].args[-1] == str(machine.project)  # "." is the project Claude Code ran in
    assert config.servers["site-files"].sandbox.writable == (str(machine.project),)
    assert config.servers["memory"].sandbox.writable == (f"{home}/Documents",)
    assert config.servers["memory"].env == {"MEMORY_FILE_PATH": f"{home}/Documents/memory.json"}
    assert config.servers["github"].env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_example"}
    assert config.servers["github"].sandbox.network == ("api.github.com:443",)
    # "${env:SEARCH_TOKEN}" is the variable the client was started with: passed through, not copied
    assert config.servers["search"].env == {} and config.servers["search"].sandbox.env == ("SEARCH_TOKEN",)
    assert config.servers["notes"].enabled is False
    assert config.servers["drafts"].enabled is False  # "false" as text: the client reads it as true
    assert "which the client reads as true" in review

    # The review names every folder and every variable (never a value), and says what was not granted.
    for shown in ("~/Documents", "~/Desktop", "~/projects", "~/projects/site"):
        assert shown in review
    for variable in ("GITHUB_PERSONAL_ACCESS_TOKEN", "MEMORY_FILE_PATH", "SEARCH_TOKEN"):
        assert variable in review
    assert "ghp_example" not in review
    assert "not granting your home directory ~ whole" in review
    assert "api.github.com:443" in review
    assert "imported as 'filesystem-cursor'" in review
    assert "same server as 'github'" in review
    assert "'remote' from VS Code" in review and "remote server" in review
    assert "'weather' from Claude Desktop" in review
    assert "BASTION_INPUT_API_KEY" in review  # the ${input:…} server is left out, with the way to supply it


def test_the_review_as_json(machine):
    machine.write_json(".config/Claude/claude_desktop_config.json", claude_desktop_file(machine))
    done = machine.bastion("import", "--json", "--dry-run")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["output"] is None and not machine.bastion_toml.exists()
    files = next(server for server in report["servers"] if server["name"] == "filesystem")
    assert files["writes"] == ["~/Documents", "~/Desktop"] and files["reaches"] == []
    assert any("home directory" in warning for warning in files["warnings"])
    github = next(server for server in report["servers"] if server["name"] == "github")
    assert github["receives"] == ["GITHUB_PERSONAL_ACCESS_TOKEN (set in the configuration)"]


def test_an_existing_configuration_is_replaced_only_with_force_and_kept_as_a_backup(machine):
    machine.write_json(".config/Claude/claude_desktop_config.json", claude_desktop_file(machine))
    output = machine.bastion_toml
    output.parent.mkdir(parents=True)
    output.write_text("# mine\n[servers]\n")

    refused = machine.bastion("import")
    assert refused.returncode == 2
    assert "--force" in refused.stderr and output.read_text() == "# mine\n[servers]\n"

    replaced = machine.bastion("import", "--force")
    assert replaced.returncode == 0, replaced.stderr
    backups = list(output.parent.glob("bastion.toml.*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == "# mine\n[servers]\n"
    assert "filesystem" in tomllib.loads(output.read_text())["servers"]
    assert oct(output.stat().st_mode & 0o777) == "0o600"  # it may hold tokens


def test_given_files_and_output(machine, tmp_path):
    given = machine.write_json("exported.json", {"mcpServers": {
        "docs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "./Documents"]}}})
    output = tmp_path / "out" / "gateway.toml"
    done = machine.bastion("import", str(given), "--output", str(output), "--allow-home")
    assert done.returncode == 0, done.stderr
    # relative to the file's folder, as a client started in that folder would read it
    assert load_config(output).servers["docs"].sandbox.writable == (f"{machine.home}/Documents",)
    assert "from file (~/exported.json)" in done.stdout


def test_allow_home_grants_the_home_directory_and_says_so(machine):
    machine.write_json(".config/Claude/claude_desktop_config.json", claude_desktop_file(machine))
    done = machine.bastion("import", "--allow-home")
    assert done.returncode == 0, done.stderr
    assert load_config(machine.bastion_toml).servers["filesystem"].sandbox.writable[-1] == str(machine.home)
    assert "granted whole" in done.stdout


def test_nothing_to_import_is_said(machine):
    done = machine.bastion("import")
    assert done.returncode == 1 and "found no client configuration" in done.stderr
    broken = machine.write_json("broken.json", {})
    broken.write_text("{ not json")
    done = machine.bastion("import", str(broken))
    assert done.returncode == 1
    assert f"{broken}: not valid JSON" in done.stdout and not machine.bastion_toml.exists()


def test_a_memory_server_keeps_its_memory_where_it_may_write(machine):
    machine.write_json(".config/Claude/claude_desktop_config.json", {"mcpServers": {
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}}})
    done = machine.bastion("import")
    assert done.returncode == 0, done.stderr
    memory = load_config(machine.bastion_toml).servers["memory"]
    folder = machine.state_home / "bastion" / "memory"
    assert memory.env == {"MEMORY_FILE_PATH": str(folder / "memory.json")}
    assert memory.sandbox.writable == (str(folder),) and folder.is_dir()
    assert "~/.local/state/bastion/memory/memory.json" in done.stdout


def test_the_dry_run_says_what_the_import_does(machine):
    """A memory server without MEMORY_FILE_PATH: the import gives it a file in Bastion's state folder itself, so the
    dry run says that (not a warning to set it), and the review is the import's, line for line."""
    machine.write_json(".cursor/mcp.json", {"mcpServers": {
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}}})
    dry = machine.bastion("import", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "MEMORY_FILE_PATH): beside its own program it would be read-only" in dry.stdout, dry.stdout
    assert "set MEMORY_FILE_PATH" not in dry.stdout
    assert not machine.bastion_toml.exists()
    done = machine.bastion("import")
    assert done.returncode == 0, done.stderr
    assert done.stdout == dry.stdout  # the dry run's review is the import's
    written = tomllib.loads(machine.bastion_toml.read_text())["servers"]["memory"]
    assert written["env"]["MEMORY_FILE_PATH"].endswith("/memory/memory.json")
