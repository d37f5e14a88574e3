"""Two cross-server fixtures behind a real ``bastion run``, and an SDK client (handshake era) that records the
sampling and elicitation requests it answers, for the taint, sampling and confused-deputy tests."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CreateMessageResult, ElicitResult, TextContent

from tests.support import BASTION, READY_TIMEOUT

FIXTURE = Path(__file__).resolve().parent / "cross_server_fixture.py"
DEADLINE = 120.0  # seconds one test may take before it counts as hung; nothing asserts durations
LLM_ANSWER = "a sampled answer"


@dataclass
class Setup:
    config: Path
    events: Path

    def event_lines(self) -> list[str]:
        return self.events.read_text().splitlines() if self.events.exists() else []

    async def wait_for_event(self, prefix: str, timeout: float = 60.0) -> str:
        with anyio.fail_after(timeout):
            while True:
                found = [line for line in self.event_lines() if line.startswith(prefix)]
                if found:
                    return found[0]
                await anyio.sleep(0.05)


def cross_server_setup(tmp_path: Path, servers: dict[str, dict[str, Any]] | None = None, **top_level: Any) -> Setup:
    """A configuration of fixture servers (by default ``web`` and ``notes``, both untrusted, as a plain
    ``mcpServers`` file gives them) with the default policy and guardrails unless ``top_level`` says otherwise.
    ``web`` stands for a server of content others wrote (web pages): unless the test says otherwise it is marked
    ``trust = "untrusted"`` explicitly, which is what makes its answers taint a session (a fixture script is no
    reference package Bastion knows, and its sandbox grants no network)."""
    events = tmp_path / "events.log"
    entries = {}
    for name, extra in (servers or {"web": {}, "notes": {}}).items():
        entries[name] = {
            "command": sys.executable,
            "args": [str(FIXTURE), name],
            "env": {"FIXTURE_EVENTS": str(events)},
            "sandbox": {"writable": [str(tmp_path)]},
            "request_timeout": 900,
            "era": "legacy",  # sampling mid-call is the handshake era's way (a 2026-07-28 server asks in its answer)
            **({"trust": "untrusted"} if name == "web" else {}),
            **extra,
        }
    policy = top_level.pop("policy", {"approval": {"fallback": "refuse", "queue_dir": str(tmp_path / "queue")},
                                      "audit": {"path": str(tmp_path / "audit.jsonl")}})
    # Pins of the test's own: the user's pins file is shared by every Bastion process (and every checkout) of the user.
    guardrails = dict(top_level.pop("guardrails", {}))
    guardrails.setdefault("pins", {"path": str(tmp_path / "pins.json")})
    top_level["guardrails"] = guardrails
    config = tmp_path / "bastion.json"
    # Every tool listed: fixture servers side by side are past the default exposure's bound (search mode).
    config.write_text(json.dumps({"ready_timeout": READY_TIMEOUT, "policy": policy, "tools": {"exposure": "all"},
                                  **top_level, "servers": entries}))
    return Setup(config, events)


@dataclass
class Person:
    """The client side: answers sampling with a fixed text and each approval with ``approve``; keeps every request."""

    approve: bool = True
    sampling_requests: list[Any] = field(default_factory=list)
    elicitation_requests: list[Any] = field(default_factory=list)

    async def on_sampling(self, context: Any, params: Any) -> CreateMessageResult:
        self.sampling_requests.append(params)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=LLM_ANSWER), model="m")

    async def on_elicitation(self, context: Any, params: Any) -> ElicitResult:
        self.elicitation_requests.append(params)
        return ElicitResult(action="accept", content={"approve": self.approve})


def client(setup: Setup, person: Person) -> Client:
    return Client(StdioServerParameters(command=BASTION, args=["run", str(setup.config), "-q"]), mode="legacy",
                  read_timeout_seconds=DEADLINE, sampling_callback=person.on_sampling,
                  elicitation_callback=person.on_elicitation)


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))
