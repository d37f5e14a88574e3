"""Every command pins and compares the same form of a definition: the server's own, before any redaction.

The secrets and personal-data scanner redacts what it finds in definitions as lists pass, so what a client is listed
is not what the server sent. A rug pull changes the server's definition, so that is what pinning keeps and
compares, whichever command met the server first: a one-shot ``bastion tools`` or ``bastion call``, or a client of
``bastion run``. A definition holding a secret-like string then raises no false alarm when the next command comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BASTION, FIXTURES, READY_TIMEOUT, RawClient, pinned_servers

DEADLINE = 90
AWS_KEY = "AKIAQ3EGRV7HZ2K4MPXN"
GITHUB_TOKEN = "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5"
EMAIL = "jane.roe@acme-mail.io"
ECHO = f"Echo text back; the example key in the docs is {AWS_KEY}"
DEPLOY = {"name": "deploy", "description": f"Deploy; questions to {EMAIL}",
          "inputSchema": {"type": "object", "properties": {"token": {"type": "string", "default": GITHUB_TOKEN}}}}
PROMPT = {"name": "brief", "description": f"A briefing that signs its requests with {AWS_KEY}"}
TEMPLATE = {"name": "note", "uriTemplate": "note://{id}", "description": f"Notes of {EMAIL}"}
SECRET_BEARING = {("tool", "echo"), ("tool", "deploy"), ("prompt", "brief"), ("resource template", "note")}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of this test's own, which every Bastion process it starts inherits."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "bastion"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The defaults (policy, guardrails), except that nobody is asked to approve a call: `bastion call` is a
    one-shot command with nobody to ask."""
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"}, "servers": {"raw": {
        "command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), "pins-agree"],
        "auto_approve": ["echo"],
        "env": {"RAW_SERVER_ECHO_DESCRIPTION": ECHO, "RAW_SERVER_EXTRA_TOOLS": json.dumps([DEPLOY]),
                "RAW_SERVER_PROMPTS": json.dumps([PROMPT]), "RAW_SERVER_TEMPLATES": json.dumps([TEMPLATE])}}}}))
    return path


def bastion(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, *args], capture_output=True, text=True, timeout=DEADLINE, stdin=subprocess.DEVNULL)


def tools(config: Path) -> None:
    listed = bastion("tools", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    catalog = {tool["name"]: tool["definition"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"raw__echo", "raw__deploy"} <= set(catalog), listed.stderr  # none withheld as changed
    assert AWS_KEY not in catalog["raw__echo"]["description"]  # what a person or a model is shown is redacted
    assert "withheld" not in listed.stderr, listed.stderr


def call(config: Path) -> None:
    called = bastion("call", str(config), "raw__echo", "--args", '{"text": "hello"}')
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["content"][0]["text"] == "hello"
    assert "withheld" not in called.stderr, called.stderr


def run(config: Path) -> None:
    client = RawClient(config)
    try:
        client.initialize()
        listed = {key: {item.get("name") for item in client.request(i, method, {}, timeout=DEADLINE)["result"][key]}
                  for i, (method, key) in enumerate((("tools/list", "tools"), ("prompts/list", "prompts"),
                                                      ("resources/templates/list", "resourceTemplates")), 1)}
        assert {"raw__echo", "raw__deploy"} <= listed["tools"]
        assert listed["prompts"] == {"raw__brief"} and listed["resourceTemplates"] == {"note"}
        called = client.request(9, "tools/call", {"name": "raw__echo", "arguments": {"text": "hello"}},
                                timeout=DEADLINE)
        assert called["result"]["content"][0]["text"] == "hello", called
        told = [m for m in client.skipped if m.get("method") == "notifications/message"
                and m["params"].get("logger") == "bastion.pinning"]
        assert told == []
    finally:
        _, stderr = client.close()
    assert "withheld" not in stderr, stderr


COMMANDS = {"tools": tools, "call": call, "run": run}


@pytest.mark.parametrize("first", list(COMMANDS))
def test_every_command_pins_and_compares_the_servers_own_definitions(first: str, config: Path, state: Path) -> None:
    COMMANDS[first](config)
    pins = pinned_servers(state / "pins.json")["raw"]
    # Pinned as the server sent them, secrets and all (the pins file is the user's own, 0600): a redacted form
    # would differ from the server's definition, and from what the other commands compare.
    assert pins["tools"]["echo"]["pinned"]["description"] == ECHO
    assert pins["tools"]["deploy"]["pinned"] == DEPLOY
    assert pins["prompts"]["brief"]["pinned"] == PROMPT
    assert pins["resourceTemplates"]["note"]["pinned"] == TEMPLATE
    for command in [*(name for name in COMMANDS if name != first), first]:
        COMMANDS[command](config)
    listed = bastion("pins", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert SECRET_BEARING <= {(row["kind"], row["name"]) for row in rows}
    assert {row["status"] for row in rows} == {"pinned"}, rows
    after = pinned_servers(state / "pins.json")["raw"]
    assert after == pins  # nothing offered as changed, nothing pinned again
