"""The generalised path guard through real processes: an honest but lax server (tests/fixtures/
benign_lookalike_server.py's read_file folds look-alikes and percent escapes onto "/" and ".") reads outside its
folder when called directly with a look-alike traversal; through ``bastion run`` with a path guard, that call is
refused with the mark it carries, and a plain name still reads."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import ElicitResult, TextContent

from tests.support import BASTION, FIXTURES, READY_TIMEOUT

DEADLINE = 180.0
SERVER = str(FIXTURES / "benign_lookalike_server.py")
TRAVERSALS = ["docs\u2215..\u2215..\u2215secret.txt", "docs/\u2024\u2024/\u2024\u2024/secret.txt",
              "docs/%2e%2e/%2e%2e/secret.txt", "docs%u2215..%u2215..%u2215secret.txt"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "notes" / "docs").mkdir(parents=True)
    (tmp_path / "notes" / "docs" / "todo.txt").write_text("buy milk")
    (tmp_path / "secret.txt").write_text("the secret outside the notes folder")
    return tmp_path


async def approve(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"approve": True})


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


async def test_control_the_lax_server_reads_outside_its_folder(tree: Path) -> None:
    parameters = StdioServerParameters(command=sys.executable, args=[SERVER],
                                       env={**os.environ, "NOTES_ROOT": str(tree / "notes")})
    with anyio.fail_after(DEADLINE):
        async with Client(parameters, mode="legacy", read_timeout_seconds=DEADLINE) as client:
            for value in TRAVERSALS[:3]:
                assert text(await client.call_tool("read_file", {"path": value})) == "the secret outside the notes folder"


async def test_look_alike_traversals_are_refused_through_bastion(tree: Path) -> None:
    config = tree / "bastion.json"
    config.write_text(json.dumps({"ready_timeout": READY_TIMEOUT, "servers": {"notes": {
        "command": sys.executable, "args": [SERVER], "env": {"NOTES_ROOT": str(tree / "notes")},
        "sandbox": {"read_only": [str(tree)]}}},
        "policy": {"guards": [{"kind": "path", "tool": "notes/read_file", "argument": "path",
                               "roots": [str(tree / "notes")]}]}}))
    parameters = StdioServerParameters(command=BASTION, args=["run", str(config), "-q"], env=dict(os.environ))
    refusals = []
    with anyio.fail_after(DEADLINE):
        async with Client(parameters, mode="legacy", elicitation_callback=approve,
                          read_timeout_seconds=DEADLINE) as client:
            assert text(await client.call_tool("notes__read_file", {"path": "docs/todo.txt"})) == "buy milk"
            for value in TRAVERSALS:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("notes__read_file", {"path": value})
                refusals.append(str(refused.value))
    assert "U+2215 DIVISION SLASH" in refusals[0] and "U+2024 ONE DOT LEADER" in refusals[1], refusals
    assert "percent sign" in refusals[2] and "percent sign" in refusals[3], refusals
    assert all("Arguments refused by policy" in words and str(tree) not in words for words in refusals)
