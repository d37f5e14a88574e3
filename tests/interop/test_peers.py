"""The official SDK client, in both eras, through ``bastion run`` to real reference servers from PyPI and npm."""

from __future__ import annotations

import json
import subprocess

import pytest
from mcp import Client, StdioServerParameters

from tests.support import BASTION, NODE_BIN, ROOT, VENV_BIN, raw_server, write_config

MODES = ["legacy", "2026-07-28"]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    base = tmp_path_factory.mktemp("peers")
    repo = base / "repo"
    repo.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost", "PATH": "/usr/bin:/bin"}
    (repo / "notes.txt").write_text("first line\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "notes.txt"], ["git", "commit", "-q", "-m", "Add notes"]):
        subprocess.run(argv, cwd=repo, env=env, check=True)
    files = base / "files"
    files.mkdir()
    (files / "hello.txt").write_text("hello from the filesystem server\n")
    config = base / "claude_desktop_config.json"
    # Policy off: this is about the peers working through Bastion at all; the default policy has its own tests. So is
    # cross-server taint, which would hold these calls from one untrusted server to the next with nobody to ask.
    # And every tool listed: four servers are past the default exposure's bound, which would show search mode.
    config.write_text(json.dumps({"ready_timeout": 120, "policy": "off", "guardrails": {"taint": "off"},
                                  "tools": {"exposure": "all"}, "mcpServers": {
        "time": {"command": str(VENV_BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
        "git": {"command": str(VENV_BIN / "mcp-server-git"), "args": ["--repository", str(repo)]},
        "everything": {"command": str(NODE_BIN / "mcp-server-everything"), "args": ["stdio"]},
        "files": {"command": str(NODE_BIN / "mcp-server-filesystem"), "args": [str(files)]},
    }}))
    return {"config": config, "repo": repo, "files": files}


def _client(config, mode: str, **kwargs) -> Client:
    return Client(StdioServerParameters(command=BASTION, args=["run", str(config), "-q"]), mode=mode,
                  read_timeout_seconds=60, **kwargs)


def _text(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


@pytest.mark.parametrize("mode", MODES)
async def test_federated_catalog_of_four_real_servers(scratch, mode):
    async with _client(scratch["config"], mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    for expected in ("time__get_current_time", "git__git_status", "files__read_text_file", "everything__echo"):
        assert expected in names
    assert all(len(name) <= 64 for name in names)
    assert all("__" in name for name in names)


@pytest.mark.parametrize("mode", MODES)
async def test_calls_reach_each_server(scratch, mode):
    async with _client(scratch["config"], mode) as client:
        converted = await client.call_tool("time__convert_time", {
            "source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
        assert "21:00" in _text(converted)
        log = await client.call_tool("git__git_log", {"repo_path": str(scratch["repo"])})
        assert "Add notes" in _text(log)
        read = await client.call_tool("files__read_text_file", {"path": str(scratch["files"] / "hello.txt")})
        assert "hello from the filesystem server" in _text(read)
        echoed = await client.call_tool("everything__echo", {"message": "through bastion"})
        assert "through bastion" in _text(echoed)


@pytest.mark.parametrize("mode", MODES)
async def test_filesystem_server_errors_come_back_as_tool_errors(scratch, mode):
    async with _client(scratch["config"], mode) as client:
        result = await client.call_tool("files__read_text_file", {"path": "/etc/shadow"})
        assert result.is_error
        assert "denied" in _text(result).lower() or "outside" in _text(result).lower()


@pytest.mark.parametrize("mode", MODES)
async def test_everything_server_resources_and_prompts(scratch, mode):
    async with _client(scratch["config"], mode) as client:
        resources = (await client.list_resources()).resources
        assert resources, "the everything server lists resources"
        first = resources[0]
        read = await client.read_resource(first.uri)
        assert read.contents and str(read.contents[0].uri) == str(first.uri)
        templates = (await client.list_resource_templates()).resource_templates
        assert any("{" in t.uri_template for t in templates)
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert "everything__simple-prompt" in prompts or any(p.startswith("everything__") for p in prompts)
        simple = next(p for p in sorted(prompts) if p.startswith("everything__"))
        got = await client.get_prompt(simple, {}) if "args" not in simple else None
        if got is not None:
            assert got.messages


def test_inspector_cli_lists_and_calls_tools_through_bastion(scratch):
    inspector = NODE_BIN / "mcp-inspector-cli"
    # inspector-cli 1.0.3 checks for "../package.json" relative to its working directory but imports it relative
    # to its own module; a working directory one level below the project root satisfies both.
    cwd = ROOT / "tests"
    listed = subprocess.run([str(inspector), "--cli", BASTION, "run", str(scratch["config"]), "-q", "--method", "tools/list"],
                            capture_output=True, text=True, timeout=180, cwd=cwd)
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert "time__get_current_time" in names and "git__git_status" in names
    called = subprocess.run([str(inspector), "--cli", BASTION, "run", str(scratch["config"]), "-q", "--method", "tools/call",
                             "--tool-name", "time__get_current_time", "--tool-arg", "timezone=UTC"],
                            capture_output=True, text=True, timeout=180, cwd=cwd)
    assert called.returncode == 0, called.stderr[-2000:]
    assert "UTC" in called.stdout


@pytest.mark.parametrize("mode", MODES)
async def test_a_malformed_tool_from_one_server_costs_that_tool_only(tmp_path, mode):
    """The SDK validates a whole tools/list at once: one unusable definition passed on would cost every tool."""
    bad = [{"name": 7, "inputSchema": {"type": "object"}}, {"name": "schemaless", "description": "no inputSchema"}]
    raw = raw_server(env={"RAW_SERVER_EXTRA_TOOLS": json.dumps(bad)})
    config = write_config(tmp_path / "bastion.json", {"raw": raw, "time": {
        "command": str(VENV_BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}})
    async with _client(config, mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        echoed = await client.call_tool("raw__echo", {"text": "still here"})
    assert {"raw__echo", "time__get_current_time"} <= names and "raw__schemaless" not in names
    assert "still here" in _text(echoed)
