"""Pins and the approval queue across replicas, end to end: a real Redis (tests/redis_server.py) named by the
configuration's ``[state]``, gateway processes (``bastion run``) as replicas of one configuration file, and the
commands (``bastion pins``, ``bastion approvals``/``approve``) given that file, all in processes of their own. A
change withheld on two replicas is released on both by one acceptance; a call waiting on one replica is listed
and approved through the store while another replica runs, and the first replica runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.support import BASTION, FIXTURES, READY_TIMEOUT, RawClient, raw_server
from tests.test_approval_once_end_to_end import LEGACY, _answer_of, _call, _next, _notice

RUG = str(FIXTURES / "rug_pull_server.py")
DEADLINE = 90


PERSISTENT = ("--appendonly", "yes")  # pins must outlive a restart of Redis: without it they are trusted afresh


@pytest.fixture
def redis():
    server = RedisServer().start(*PERSISTENT)
    yield server
    server.close()


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "bastion"


def bastion(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, *argv], capture_output=True, text=True, timeout=DEADLINE, stdin=subprocess.DEVNULL)


def tools(client: RawClient, request_id: int) -> set[str]:
    return {tool["name"] for tool in client.request(request_id, "tools/list", {}, timeout=DEADLINE)["result"]["tools"]}


def advance(client: RawClient, request_id: int) -> None:
    """Move the replica's server to its next stage (a rug pull announced by list_changed)."""
    answer = client.request(request_id, "tools/call", {"name": "rug__advance", "arguments": {}}, timeout=DEADLINE)
    assert answer["result"]["content"][0]["text"] == "stage 1", answer


def told_list_changed(client: RawClient) -> None:
    while not any(m.get("method") == "notifications/tools/list_changed" for m in client.skipped):
        client.skipped.append(client.recv(timeout=DEADLINE))
    client.skipped.clear()


def test_a_change_withheld_on_two_replicas_is_released_on_both_by_one_acceptance(
        tmp_path: Path, state_dir: Path, redis: RedisServer) -> None:
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"rug": {"command": sys.executable, "args": [RUG], "trust": "reviewed"}}, "policy": "off",
        "guardrails": {"servers": {"rug": {"metadata_injection": "off"}}},
        "ready_timeout": READY_TIMEOUT, "state": {"url": redis.url}}))
    first = RawClient(config)
    try:
        first.initialize()
        assert "rug__delete_file" in tools(first, 1)
    finally:
        first.close()  # the replica that pinned it is gone
    a, b = RawClient(config), RawClient(config)
    try:
        a.initialize()
        b.initialize()
        assert "rug__delete_file" in tools(a, 1) and "rug__delete_file" in tools(b, 1)  # as pinned

        # Redis gone while A's server changes: the change is withheld against the pins A read, and what is offered
        # for the first time is withheld too (another replica may have pinned something else under its name).
        redis.stop()
        advance(a, 2)
        told_list_changed(a)
        assert tools(a, 3) == {"rug__advance"}
        refused = a.request(4, "tools/call", {"name": "rug__multiply", "arguments": {"a": 2, "b": 3}},
                            timeout=DEADLINE)
        assert "error" in refused, refused
        refused = refused["error"]
        assert "offered for the first time, and whether another replica pinned it cannot be checked" in \
            refused["message"]
        down = bastion("pins", "accept", "rug/delete_file", "--config", str(config))
        assert down.returncode == 2 and "cannot be reached" in down.stderr, down.stderr
        redis.start(*PERSISTENT)  # back, pins and all: the first use is confirmed, the change still withheld
        assert tools(a, 5) == {"rug__advance", "rug__multiply"}

        advance(b, 2)  # B's server changes too
        told_list_changed(b)
        assert "rug__delete_file" not in tools(b, 3)
        diff = bastion("pins", "diff", "rug/delete_file", "--config", str(config))
        assert diff.returncode == 0, diff.stderr
        assert "withheld, changed since it was pinned" in diff.stdout
        accepted = bastion("pins", "accept", "rug/delete_file", "--config", str(config))
        assert accepted.returncode == 0, accepted.stderr
        assert accepted.stdout == "accepted rug/delete_file (tool)\n"
        # A replica that left it out of a list watches the store and tells its client the list changed.
        told_list_changed(a)
        assert "rug__delete_file" in tools(a, 6)
        assert "rug__delete_file" in tools(b, 4)
    finally:
        a.close()
        b.close()
    assert not (state_dir / "pins.json").exists()  # all of it in Redis


def test_a_call_waiting_on_one_replica_is_approved_through_the_store_while_another_runs(
        tmp_path: Path, state_dir: Path, redis: RedisServer) -> None:
    entry = raw_server(tmp_path / "marks", auto_approve=["echo"])
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": entry}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "policy": {"approval": {"fallback": "queue", "timeout_seconds": 120, "poll_seconds": 0.1},
                   "audit": {"path": str(tmp_path / "audit.jsonl")}},
        "state": {"url": redis.url}}))
    a, b = RawClient(config), RawClient(config)
    try:
        a.initialize(LEGACY)  # no elicitation: the call waits in the queue
        b.initialize(LEGACY)
        _call(a, 1)
        notice = _next(a, _notice)["params"]["data"]
        approval_id = notice["approvalId"]
        assert f"--config {config}" in notice["message"]
        listed = bastion("approvals", "--json", "--config", str(config))
        assert listed.returncode == 0, listed.stderr
        [waiting] = json.loads(listed.stdout)
        assert waiting["id"] == approval_id and waiting["tool"] == "big" and waiting["replica"]
        approved = bastion("approve", approval_id, "--config", str(config))
        assert approved.returncode == 0, approved.stderr
        assert _next(a, _answer_of(1))["result"]["content"][0]["text"] == "x"
        again = bastion("deny", approval_id, "--config", str(config))
        assert again.returncode == 1 and "already approved" in again.stderr
        assert b.request(2, "tools/call", {"name": "raw__echo", "arguments": {"text": "b"}},
                         timeout=DEADLINE)["result"]["content"][0]["text"] == "b"
    finally:
        a.close()
        b.close()
    assert not (state_dir / "approvals").exists()  # all of it in Redis

    redis.stop()  # Redis gone: nothing can be approved, and the command says why
    refused = bastion("approve", approval_id, "--config", str(config))
    assert refused.returncode == 1 and "nothing was approved or denied" in refused.stderr


def test_the_credentials_commands_act_on_the_replicas_store_and_only_ciphertext_reaches_it(
        tmp_path: Path, state_dir: Path, redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    import secrets

    import redis as redis_client

    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"up": {**raw_server(), "scope": "per_identity", "identity_env": {"UP_TOKEN": "up-token"}}},
        "state": {"url": redis.url, "key_prefix": "replicas:"}}))
    monkeypatch.delenv("BASTION_CREDENTIALS_KEY", raising=False)
    refused = bastion("credentials", "list", "--config", str(config))
    assert refused.returncode == 2 and "BASTION_CREDENTIALS_KEY is not set" in refused.stderr

    monkeypatch.setenv("BASTION_CREDENTIALS_KEY", base64.b64encode(secrets.token_bytes(32)).decode())
    secret = "s3cret-" + secrets.token_hex(8)
    stored = subprocess.run([BASTION, "credentials", "set", "alice", "up", "up-token", "--config", str(config)],
                            input=secret + "\n", capture_output=True, text=True, timeout=DEADLINE)
    assert stored.returncode == 0, stored.stderr
    listed = bastion("credentials", "list", "--json", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert "alice" in listed.stdout and secret not in listed.stdout
    raw = redis_client.Redis(host="127.0.0.1", port=redis.port).get("replicas:credentials:document")
    assert raw is not None and secret.encode() not in raw and b"alice" not in raw
    assert not (state_dir / "credentials.enc").exists() and not (state_dir / "credentials.key").exists()
    assert bastion("credentials", "revoke", "alice", "--config", str(config)).returncode == 0
    assert "alice" not in bastion("credentials", "list", "--json", "--config", str(config)).stdout

    redis.stop()  # gone: the command says so, changes nothing, and exits 2
    down = bastion("credentials", "revoke", "alice", "--config", str(config))
    assert down.returncode == 2 and "cannot be reached" in down.stderr
