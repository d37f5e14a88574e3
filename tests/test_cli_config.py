"""The configuration loader's errors and the CLI commands, run as real processes."""

from __future__ import annotations

import json
import subprocess

import pytest

from bastion.config import ConfigError, load_config
from tests.support import BASTION, raw_server, write_config


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([BASTION, *args], capture_output=True, text=True, timeout=timeout)


def test_mcp_servers_json_is_accepted_as_clients_write_it(tmp_path):
    config = tmp_path / "claude_desktop_config.json"
    config.write_text(json.dumps({"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "old": {"command": "x", "disabled": True, "autoApprove": []},
        "remote": {"url": "https://example.invalid/mcp"},
    }}))
    loaded = load_config(config)
    assert loaded.servers["time"].args == ["mcp-server-time"]
    assert loaded.servers["time"].env == {"TZ": "UTC"}
    assert loaded.servers["old"].enabled is False
    assert loaded.servers["remote"].url == "https://example.invalid/mcp" and loaded.servers["remote"].command is None


def test_vs_code_servers_format_is_accepted(tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": {"t": {"type": "stdio", "command": "mcp-server-time"}}, "inputs": []}))
    assert load_config(config).servers["t"].command == "mcp-server-time"


@pytest.mark.parametrize("body, where, fix", [
    ({"servers": {"a": {"comand": "x"}}}, "servers.a.comand", "remove it"),
    ({"servers": {"a": {"args": []}}}, "servers.a.command", "add it"),
    ({"servers": {"a": {"command": "x", "request_timeout": -1}}}, "servers.a.request_timeout", "-1"),
    ({"servers": {"a": {"command": "x", "sandbox": "nope"}}}, "servers.a.sandbox", "unknown sandbox profile"),
    ({"tools": {"embedding_tokens": 8}}, "tools.embedding_tokens", "greater than or equal to 16"),
    ({"policy": {"audit": {"enabled": False, "on_failure": "refuse"}}}, "policy.audit", "set enabled = true"),
])
def test_errors_name_the_file_the_key_and_the_fix(tmp_path, body, where, fix):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps(body))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    message = str(err.value)
    assert str(config) in message and where in message and fix in message


def test_a_type_error_says_what_to_write_in_the_files_own_syntax(tmp_path):
    """Each type's fix is the line to write: a list, a string, a number, a boolean, a table."""
    bad = tmp_path / "mcp.json"
    bad.write_text(json.dumps({"mcpServers": {"x": {
        "command": "server", "args": "--port 8080", "env": {"PORT": 8080}, "enabled": "maybe",
        "request_timeout": "thirty", "sandbox": 3}}}))
    said = _run("check", str(bad)).stderr
    assert 'mcpServers.x.args: Input should be a valid list — fix: write "args": ["--port", "8080"]' in said
    assert 'mcpServers.x.env.PORT: Input should be a valid string — fix: write "PORT": "8080"' in said
    assert 'fix: write "enabled": true or false' in said
    assert 'fix: write "request_timeout": 10 (a number, without quotes)' in said
    assert 'mcpServers.x.sandbox: Input should be a valid dictionary' in said

    toml = tmp_path / "bastion.toml"
    toml.write_text('[servers.x]\ncommand = "server"\nargs = "--db-path \'my shop.db\'"\nsandbox = 3\n')
    said = _run("check", str(toml)).stderr
    assert 'servers.x.args: Input should be a valid list — fix: write args = ["--db-path", "my shop.db"]' in said
    assert "fix: write [servers.x.sandbox] as a table of its settings" in said


TOKEN = "ghp_" + "R3aLl00kingTok3nValue0123456789abcdE"  # a GitHub token's form, made up


def test_check_suggests_env_for_a_token_written_in_a_local_servers_env(tmp_path):
    cursor = tmp_path / "mcp.json"
    cursor.write_text(json.dumps({"mcpServers": {"github": {"command": "/bin/true", "env": {
        "GITHUB_PERSONAL_ACCESS_TOKEN": TOKEN, "PORT": "8080", "FROM_ENV": "${env:HOME}"}}}}))
    done = _run("check", str(cursor))
    assert done.returncode == 0, done.stderr  # a warning: the file works as it is
    assert ('warning: mcpServers.github.env.GITHUB_PERSONAL_ACCESS_TOKEN: a github-pat written in plain text'
            in done.stderr)
    assert 'fix: write "GITHUB_PERSONAL_ACCESS_TOKEN": "${env:GITHUB_PERSONAL_ACCESS_TOKEN}"' in done.stderr
    assert TOKEN not in done.stderr and "PORT" not in done.stderr.split("policy:")[1]
    assert "FROM_ENV" not in done.stderr.split("policy:")[1]  # taken from the environment already

    own = tmp_path / "bastion.toml"
    own.write_text(f'[servers.gh]\ncommand = "/bin/true"\n[servers.gh.env]\nGH_TOKEN = "{TOKEN}"\n')
    said = _run("check", str(own)).stderr
    assert 'fix: write GH_TOKEN = "${env:GH_TOKEN}" under [servers.gh.env]' in said


def test_unparseable_files_are_reported_with_their_name(tmp_path):
    toml = tmp_path / "b.toml"
    toml.write_text("[servers.a\ncommand = 1")
    with pytest.raises(ConfigError, match="b.toml: not valid TOML"):
        load_config(toml)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_toml_config(tmp_path):
    config = tmp_path / "bastion.toml"
    config.write_text('[servers.time]\ncommand = "mcp-server-time"\nprefix = ""\n[servers.time.sandbox]\nmemory = "256MiB"\n')
    loaded = load_config(config)
    assert loaded.servers["time"].prefix == ""
    assert int(loaded.servers["time"].sandbox.memory) == 256 * 1024 * 1024


def test_check_command(tmp_path):
    good = write_config(tmp_path / "good.json", {"raw": raw_server()})
    done = _run("check", str(good))
    assert done.returncode == 0 and "configuration OK" in done.stderr and done.stdout == ""
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": {"raw": {"command": ""}}}')
    done = _run("check", str(bad))
    assert done.returncode == 2 and "servers.raw.command" in done.stderr


def test_tools_and_call_commands(tmp_path):
    config = write_config(tmp_path / "c.json", {"raw": raw_server(), "broken": {"command": "/nonexistent/server"}})
    listed = _run("tools", str(config), "-q")
    assert "raw__echo" in listed.stdout and "raw__slow" in listed.stdout
    assert "not available: broken" in listed.stderr  # one server failing to start never stops the others
    called = _run("call", str(config), "raw__echo", "--args", '{"text": "hello"}', "-q")
    assert called.returncode == 0
    assert json.loads(called.stdout)["content"][0]["text"] == "hello"
    bad_args = _run("call", str(config), "raw__echo", "--args", "[1]")
    assert bad_args.returncode == 2 and "JSON object" in bad_args.stderr
    unknown = _run("call", str(config), "raw__missing", "-q")
    assert unknown.returncode == 1 and "Unknown tool: raw__missing" in unknown.stderr


def test_prefix_override_and_no_prefix(tmp_path):
    config = write_config(tmp_path / "c.json", {"raw": raw_server(prefix="r"), "plain": raw_server(prefix="")})
    listed = _run("tools", str(config), "-q")
    assert "r__echo" in listed.stdout
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
    assert "echo" in names or "plain__echo" in names  # bare names unless they collide


def test_tools_stats_counts_the_live_catalog(tmp_path):
    config = write_config(tmp_path / "c.json", {"raw": raw_server()})
    done = _run("tools", "stats", str(config), "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    text = json.dumps(figures)
    assert "raw" in text and "o200k_base" in text


def test_tools_eval_on_a_small_catalog(tmp_path):
    tools = tmp_path / "tools.jsonl"
    tools.write_text("\n".join(json.dumps(t) for t in [
        {"id": "a", "name": "get_weather", "description": "Current weather for a city", "inputSchema": {"type": "object"}},
        {"id": "b", "name": "send_email", "description": "Send an email message", "inputSchema": {"type": "object"}},
    ]))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"query": "what's the weather in Paris", "relevant": ["a"]}))
    done = _run("tools", "eval", "--tools", str(tools), "--queries", str(queries), "--json", "--lexical-only")
    assert done.returncode == 0, done.stderr
    assert "1" in done.stdout and "recall" in done.stdout.lower()


def test_a_file_without_a_policy_section_gets_the_default_policy_and_audit_under_xdg_state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for body in ({"mcpServers": {"a": {"command": "x"}}}, {"servers": {"a": {"command": "x"}}}):
        config = tmp_path / "c.json"
        config.write_text(json.dumps(body))
        policy = load_config(config).policy
        assert policy is not None and policy.audit.enabled and policy.approval.fallback == "queue"
        assert policy.audit.path == str(tmp_path / "state" / "bastion" / "audit.jsonl")
        assert policy.approval.queue_dir == str(tmp_path / "state" / "bastion" / "approvals")


@pytest.mark.parametrize("switch", ["off", False, None])
def test_policy_off_is_a_written_switch(tmp_path, switch):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"policy": switch, "mcpServers": {"a": {"command": "x"}}}))
    assert load_config(config).policy is None


def test_findings_of_loading_are_logged_for_bastion_run_and_kept_for_check(tmp_path, caplog):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "disabled": "yes"}}, "globalShortcut": "x"}))
    with caplog.at_level("WARNING", logger="bastion.config"):
        loaded = load_config(config)
    assert loaded.servers == {} and {n.where for n in loaded.load_notes} == {"mcpServers.a.disabled", "(top level)"}
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]
    assert str(config) in caplog.records[1].getMessage() and "fix:" in caplog.records[1].getMessage()


def test_dotenv_files_as_clients_write_them(tmp_path):
    from bastion.variables import read_dotenv

    env = tmp_path / ".env"
    env.write_text('# comment\n\nexport A=1\nB = two words # note\nC="quoted # kept"\nD=\'single\'\nE=\n')
    assert read_dotenv(env) == {"A": "1", "B": "two words", "C": "quoted # kept", "D": "single", "E": ""}
    env.write_text("NOT A LINE\n")
    with pytest.raises(ValueError, match="line 1"):
        read_dotenv(env)


def test_unknown_variables_are_refused_not_passed_through(tmp_path):
    from bastion.variables import VariableError, Variables

    variables = Variables(tmp_path, tmp_path, {})
    with pytest.raises(VariableError, match="not a variable Bastion knows"):
        variables.expand("${command:pickFile}")
    assert variables.expand("plain $HOME and ${/}") == "plain $HOME and /"


def test_a_client_file_with_comments_and_trailing_commas_is_read_as_import_reads_it(tmp_path):
    """VS Code's .vscode/mcp.json has comments by default, and hand-edited Claude Desktop and Cursor files often
    carry them or a trailing comma: run, check and serve read them as import does."""
    vscode = tmp_path / "mcp.json"
    vscode.write_text('\ufeff{\n  // Servers for this folder\n  "servers": {\n    "time": {\n'
                      '      "type": "stdio", /* the reference time server */\n'
                      '      "command": "mcp-server-time",\n      "args": ["--local-timezone=UTC",],\n    },\n  },\n}\n')
    loaded = load_config(vscode)
    assert loaded.servers["time"].command == "mcp-server-time"
    assert loaded.servers["time"].args == ["--local-timezone=UTC"]
    assert "// Servers" not in str(loaded.servers)


def test_an_error_in_a_file_with_comments_is_reported_where_the_editor_shows_it(tmp_path):
    config = tmp_path / "cursor.json"
    config.write_text('{\n  /* a comment\n     over lines */\n  "mcpServers": {\n    "a": {"command": "x" "args": []}\n  }\n}\n')
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(config) in str(err.value) and "line 5 column 26" in str(err.value)
