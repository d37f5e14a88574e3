"""Every channel through `bastion run` (a real process) in front of a real SDK server that leaks an AWS key and a
GitHub token on each: the client's every frame, decoded payloads included, is free of both, and what it receives
says where each was redacted. The test waits for the notifications it expects, never for a time."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pytest

from tests.fixtures import channel_server as leaky
from tests.support import FIXTURES, RawClient

TIMEOUT = 120.0


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({
        "policy": "off", "ready_timeout": TIMEOUT,
        "servers": {"ch": {"command": sys.executable, "args": [str(FIXTURES / "channel_server.py")],
                           "era": "legacy"}}}))
    return path


@pytest.fixture
def client(tmp_path):
    raw = RawClient(_config(tmp_path), log=tmp_path / "stderr.log")
    raw.initialize()
    yield raw
    raw.close()


def _leaked(frame: bytes) -> list[str]:
    """The secrets in a frame as Bastion wrote it, or in any base64 payload in it."""
    found = [secret for secret in leaky.SECRETS if secret.encode() in frame]
    stack = [json.loads(frame)]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if key in ("data", "blob") and isinstance(item, str):
                    try:
                        decoded = base64.b64decode(item + "=" * (-len(item) % 4))
                    except ValueError:
                        decoded = b""
                    found += [secret for secret in leaky.SECRETS if secret.encode() in decoded]
                stack.append(item)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def test_no_channel_carries_a_secret_to_the_client(client, tmp_path):
    frames: list[bytes] = []
    client.send({"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "debug"}})
    client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "ch__leak_everywhere", "arguments": {}, "_meta": {"progressToken": "p-1"}}})
    client.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "ch__fail_loudly",
                                                                                 "arguments": {}}})
    seen: dict = {}
    # Settled once both answers and the two notifications the server sent during the call have arrived.
    while not ({2, 3} <= seen.keys() and "notifications/progress" in seen and "notifications/message" in seen):
        frame = client.recv_line(TIMEOUT)
        frames.append(frame)
        message = json.loads(frame)
        seen.setdefault(message.get("method") or message.get("id"), message)
    assert [leak for frame in frames for leak in _leaked(frame)] == []

    progress = seen["notifications/progress"]["params"]
    assert progress["message"] == "uploading with [redacted: aws-access-key]"
    log = seen["notifications/message"]["params"]
    assert log["logger"].startswith("ch/up-[redacted: github-pat]")
    assert log["data"]["connection"] == "aws://[redacted: aws-access-key]"
    result = seen[2]["result"]
    texts = [block.get("text") for block in result["content"]]
    assert texts[0] == "done"
    assert result["content"][0]["annotations"]["lastModified"] == "[redacted: github-pat]"
    assert result["content"][0]["_meta"]["signed"] == "[redacted: aws-access-key]"
    assert texts[1] == "key part one: [redacted: aws-access-key]"
    assert texts[2] == "[redacted: aws-access-key] and that is all"
    assert texts[3] == "token [redacted: github-pat]"
    assert base64.b64decode(result["content"][4]["data"]).endswith(b"key=[redacted: aws-access-key]")
    assert b"[redacted: aws-access-key]" in base64.b64decode(result["content"][5]["resource"]["blob"])
    assert result["structuredContent"] == {"[redacted: aws-access-key]": {"status": "uploaded"},
                                           "by": "[redacted: github-pat]"}
    assert result["_meta"]["debug"] == "credentials [redacted: aws-access-key]"
    error = seen[3]["error"]
    assert error["message"].endswith("upload refused for [redacted: aws-access-key]")
    logged = (tmp_path / "stderr.log").read_text()
    assert "guardrail secrets redacted aws-access-key on server ch, notifications/progress" in logged
    assert not any(secret in logged for secret in leaky.SECRETS)


def test_a_clean_call_passes_unchanged(client):
    answer = client.request(4, "tools/call", {"name": "ch__plain", "arguments": {}}, timeout=TIMEOUT)
    assert answer["result"]["content"] == [{"type": "text", "text": "nothing secret here"}]


@pytest.mark.parametrize("era", ["2025-11-25", "2026-07-28"])
def test_the_servers_instructions_reach_the_client_redacted(tmp_path, era):
    """The instructions are in Bastion's answer to initialize (or, for 2026-07-28, server/discover), which passes the
    chain like any other: the scanner redacts them there."""
    raw = RawClient(_config(tmp_path), log=tmp_path / "stderr.log")
    try:
        if era == "2025-11-25":
            answer = raw.initialize()
        else:
            answer = raw.request(0, "server/discover", {"_meta": {
                "io.modelcontextprotocol/protocolVersion": era, "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"}}}, timeout=60)
    finally:
        raw.close()
    instructions = answer["result"]["instructions"]
    assert leaky.AWS_KEY not in instructions
    assert instructions == "[ch] Uploads need the key [redacted: aws-access-key]; ask for it."
