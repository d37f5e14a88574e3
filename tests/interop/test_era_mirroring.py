"""A handshake-era client in front of a server that speaks both eras, found by the probe (``era = "auto"``): Bastion
speaks the client's era to it, so the server's mid-call requests have a back-channel.

The server is the official Python SDK's conformance everything-server (``tests/conformance/everything_server.py``),
whose tools ask the client mid-call and, on a 2026-07-28 connection (which has none), answer "this transport
context has no back-channel"; so each call's text tells which era reached the server. Real processes: the SDK's
client runs ``bastion run``, which starts the server over stdio in its sandbox.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.conformance.everything_server import EVERYTHING_DIR, missing
from tests.interop.test_relays import DEADLINE, LLM_ANSWER, Inbox, text_of
from tests.support import BASTION, READY_TIMEOUT

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

EVERYTHING = Path(__file__).resolve().parents[1] / "conformance" / "everything_server.py"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    if reason := missing():
        pytest.fail(reason)
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT,
                                "servers": {"ev": {
                                    "command": sys.executable, "args": [str(EVERYTHING)], "prefix": "",
                                    "request_timeout": 900,
                                    "sandbox": {"read_only": [str(EVERYTHING_DIR)]}}}}))
    return path


def client(config: Path, mode: str, inbox: Inbox) -> Client:
    return Client(StdioServerParameters(command=BASTION, args=["run", str(config), "-q"]), mode=mode,
                  read_timeout_seconds=DEADLINE, message_handler=inbox.on_message, logging_callback=inbox.on_log,
                  sampling_callback=inbox.on_sampling, elicitation_callback=inbox.on_elicitation)


async def test_sampling_and_elicitation_mid_call_reach_a_handshake_era_client(config: Path) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with client(config, "legacy", inbox) as session:
            sampled = await session.call_tool("test_sampling", {"prompt": "What is 2+2?"})
            elicited = await session.call_tool("test_elicitation", {"message": "Go on?"})
            logged = await session.call_tool("test_tool_with_logging", {})
    assert text_of(sampled) == f"LLM response: {LLM_ANSWER}"
    [asked] = inbox.sampling_requests
    assert asked.messages[0].content.text == "What is 2+2?"
    assert text_of(elicited) == 'User response: action=accept, content={"response":"yes please"}'
    assert [request.message for request in inbox.elicitation_requests] == ["Go on?"]
    # the handshake-era connection's log messages reach the client whose call they came with
    assert not logged.is_error
    assert "Tool execution completed" in [log.data for log in inbox.logs]


async def test_a_2026_client_keeps_the_stateless_era(config: Path) -> None:
    """The same server, a 2026-07-28 client: its requests reach the server in 2026-07-28, whose tool then has no
    back-channel to ask on (the server's own answer: Bastion does not turn the client's era into another)."""
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with client(config, "2026-07-28", inbox) as session:
            sampled = await session.call_tool("test_sampling", {"prompt": "What is 2+2?"})
    assert "no back-channel" in text_of(sampled)
    assert not inbox.sampling_requests
