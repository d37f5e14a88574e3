"""A tool a screen withholds (a pinned definition that changed, a definition carrying instructions) is refused through
the search mode's ``call_tool`` with the very refusal a direct ``tools/call`` of it gets, in both protocol eras, and
is never found by ``search_tools``; a tool hidden by policy stays "unknown" (tests/test_search_mode.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.support import BASTION, FIXTURES, READY_TIMEOUT

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

RUG = str(FIXTURES / "rug_pull_server.py")
DEADLINE = 120


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder (pins) of this test's own; the SDK's stdio client passes XDG_STATE_HOME on."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def _config(tmp_path: Path, stage: int, screen: str) -> Path:
    # The other screen is off for the server, so what is refused is this screen's doing alone.
    other = {"pinning": {"metadata_injection": "off"}, "metadata_injection": {"pinning": "off"}}[screen]
    # One file, rewritten: pins belong to a configuration file's server (docs/guardrails.md, "Whose pins").
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({
        "servers": {"rug": {"command": sys.executable, "args": [RUG], "env": {"RUG_STAGE": str(stage)},
                            "trust": "reviewed"}},
        "tools": {"exposure": "search"},
        "guardrails": {"servers": {"rug": other}},
        "policy": "off",
        "ready_timeout": READY_TIMEOUT,
    }))
    return path


def _client(config: Path, mode: str) -> Client:
    return Client(StdioServerParameters(command=BASTION, args=["run", str(config), "-q"]), mode=mode,
                  read_timeout_seconds=DEADLINE)


async def _refusal(call) -> str:
    with pytest.raises(MCPError) as refused:
        await call
    return refused.value.error.message


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("screen", ["pinning", "metadata_injection"])
async def test_call_tool_of_a_withheld_tool_says_why_as_a_direct_call_does(tmp_path, state, mode, screen) -> None:
    with anyio.fail_after(DEADLINE):
        if screen == "pinning":  # the first run pins stage 0's definitions
            async with _client(_config(tmp_path, 0, screen), mode) as first:
                found = await first.call_tool("search_tools", {"query": "add two numbers", "k": 5})
                assert "rug__add" in found.content[0].text
        async with _client(_config(tmp_path, 1, screen), mode) as session:
            listed = {tool.name for tool in (await session.list_tools()).tools}
            assert listed == {"search_tools", "call_tool"}
            found = await session.call_tool("search_tools", {"query": "add two numbers with a note", "k": 20})
            assert "rug__add" not in found.content[0].text  # neither found nor described
            direct = await _refusal(session.call_tool("rug__add", {"a": 1, "b": 2, "note": "x"}))
            through = await _refusal(session.call_tool("call_tool", {
                "name": "rug__add", "arguments": {"a": 1, "b": 2, "note": "x"}}))
            # A name that no screen withheld is still unknown, so call_tool cannot probe for hidden tools.
            unknown = await session.call_tool("call_tool", {"name": "rug__nothing_of_the_kind"})
            served = await session.call_tool("call_tool", {"name": "rug__multiply", "arguments": {"a": 2, "b": 3}})
    assert through == direct
    assert "withheld" in through and "'rug__add'" in through
    if screen == "pinning":
        assert f"`bastion pins diff rug/add --config {(tmp_path / 'bastion.json').resolve()}`" in through
    else:
        assert "metadata_injection" in through
    assert unknown.is_error and "unknown tool" in unknown.content[0].text
    assert served.content[0].text == "6"
