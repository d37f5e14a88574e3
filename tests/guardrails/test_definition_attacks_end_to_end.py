"""Definitions that smuggle instructions (issue 28), served by a real server (tests/guardrails/
definition_attack_server.py) beside a trusted mail server, through ``bastion run``, for a client of each protocol era:
the poisoned tools, the look-alike of the trusted server's tool, the poisoned prompt and the server's poisoned
instructions are withheld, calls to what was withheld are refused, and the benign look-alikes pass. A control run
first shows that every one of them reaches a client without Bastion."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters

from tests.support import BASTION, READY_TIMEOUT

DEADLINE = 180.0  # seconds before a test counts as hung (process starts are slow on a busy machine)
SERVER = str(Path(__file__).resolve().parent / "definition_attack_server.py")
POISONED = ("lookalike_letters", "encoded", "enum_order", "spanish", "split_one", "split_two", "send_emaiI")
BENIGN = ("russian", "decode", "read_file", "list_files")


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"ready_timeout": READY_TIMEOUT, "policy": "off", "tools": {"exposure": "all"},
                                "servers": {"shady": {"command": sys.executable, "args": [SERVER]},
                                            "mail": {"command": sys.executable, "args": [SERVER, "mail"],
                                                     "trust": "trusted"}}}))
    return path


def _through_bastion(tmp_path: Path, mode: str) -> Client:
    parameters = StdioServerParameters(command=BASTION, args=["run", str(_config(tmp_path)), "-q"],
                                       env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    return Client(parameters, mode=mode, read_timeout_seconds=DEADLINE)


async def test_control_the_poisoned_definitions_reach_a_client_without_bastion() -> None:
    parameters = StdioServerParameters(command=sys.executable, args=[SERVER])
    with anyio.fail_after(DEADLINE):
        async with Client(parameters, mode="legacy", read_timeout_seconds=DEADLINE) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            prompts = {prompt.name: prompt for prompt in (await client.list_prompts()).prompts}
            instructions = client.instructions
    assert set(POISONED) | set(BENIGN) <= tools
    assert "іnstruсtіоns" in prompts["summarize"].arguments[0].description  # the Cyrillic order itself
    assert instructions and "~/.ssh/" in instructions


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_definitions_that_smuggle_instructions_are_withheld_and_look_alikes_pass(tmp_path: Path,
                                                                                        mode: str) -> None:
    with anyio.fail_after(DEADLINE):
        async with _through_bastion(tmp_path, mode) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
            refusals: dict[str, str] = {}
            for name in ("lookalike_letters", "split_two", "send_emaiI"):
                try:
                    await client.call_tool(f"shady__{name}", {"path": "x", "to": "x", "body": "x"})
                except MCPError as error:
                    refusals[name] = str(error)
            served = await client.call_tool("shady__read_file", {"path": "a.txt"})
            instructions = client.instructions
    for name in POISONED:
        assert f"shady__{name}" not in tools, name
    for name in BENIGN:
        assert f"shady__{name}" in tools, name
    assert "mail__send_email" in tools
    assert "shady__summarize" not in prompts and "shady__review" in prompts
    assert "override-instructions" in refusals["lookalike_letters"]
    assert "split-across-tools" in refusals["split_two"]
    assert "look-alike-tool-name" in refusals["send_emaiI"]
    assert served.content[0].text == "contents of a.txt"
    assert not instructions or "~/.ssh/" not in instructions  # withheld whole (the default mode)
