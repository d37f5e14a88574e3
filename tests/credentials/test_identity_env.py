"""Per-identity secrets for a local server: each identity's process is started with that identity's own value, set
with ``bastion credentials set`` (a real CLI process reading stdin); nobody else's process has it; a caller whose
value is not set is told the command that sets it; a revocation stops the process that had it before its next call.
Real gateways, real server processes, callers sent through the gateway's request path as every frontend sends them."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.model import GatewayError, GatewayRequest, Identity, Session
from tests.support import BASTION, FIXTURES

ALICE = Identity("alice", ("dev",))
BOB = Identity("bob", ("dev",))
CAROL = Identity("carol", ("dev",))


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "credentials", *args], input=stdin, capture_output=True, text=True, timeout=60)


async def _getenv(gateway: Any, who: Identity, name: str = "GITHUB_TOKEN") -> str:
    session = Session(who, "legacy", "2025-11-25", {}, {"name": "test"}, f"s-{who.name}")
    result = await gateway.handle(GatewayRequest("tools/call", {"name": "env__getenv", "arguments": {"name": name}},
                                                 session, gateway.catalog, request_id=1))
    decoded = result.decoded().result if hasattr(result, "decoded") else result
    return decoded["content"][0]["text"]


@pytest.fixture
async def gateway():
    entry = {"command": sys.executable, "args": [str(FIXTURES / "env_server.py")], "scope": "per_identity",
             "sandbox": {"profile": "none"}, "env": {"GITHUB_TOKEN": "catalog-only"},
             "identity_env": {"GITHUB_TOKEN": "github_token"}}
    built = build_gateway(GatewayConfig(servers={"env": ServerConfig.model_validate(entry)}, policy=None,
                                        guardrails=None))
    built.start()
    await built.wait_ready(120)
    yield built
    await built.close()


async def test_each_identity_s_process_gets_its_own_secret_and_nobody_else_s(gateway) -> None:
    assert _cli("set", "alice", "env", "github_token", stdin="ghp_alice_1\n").returncode == 0
    assert _cli("set", "bob", "env", "github_token", stdin="ghp_bob_1").returncode == 0

    alice, bob = await _getenv(gateway, ALICE), await _getenv(gateway, BOB)
    assert alice.startswith("ghp_alice_1 ") and bob.startswith("ghp_bob_1 ")
    assert alice.split("pid=")[1] != bob.split("pid=")[1]  # two processes
    # Bastion's own instance, which lists the tools, has the server's plain env, nobody's secret
    assert gateway.upstreams["env"].config.env["GITHUB_TOKEN"] == "catalog-only"

    listed = _cli("list")
    assert listed.returncode == 0
    assert "alice" in listed.stdout and "github_token" in listed.stdout
    assert "ghp_alice_1" not in listed.stdout + listed.stderr


async def test_a_caller_without_the_secret_is_told_how_to_set_it(gateway) -> None:
    with pytest.raises(GatewayError) as refused:
        await _getenv(gateway, CAROL)
    assert "bastion credentials set carol env github_token" in refused.value.message


async def test_a_revoked_secret_stops_the_process_that_had_it(gateway) -> None:
    assert _cli("set", "alice", "env", "github_token", stdin="ghp_alice_2\n").returncode == 0
    first = await _getenv(gateway, ALICE)
    assert first.startswith("ghp_alice_2 ")

    revoked = _cli("revoke", "alice", "env")
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(GatewayError) as refused:
        await _getenv(gateway, ALICE)
    assert "bastion credentials set alice env github_token" in refused.value.message

    assert _cli("set", "alice", "env", "github_token", stdin="ghp_alice_3\n").returncode == 0
    again = await _getenv(gateway, ALICE)
    assert again.startswith("ghp_alice_3 ")
    assert again.split("pid=")[1] != first.split("pid=")[1]  # a new process, started with the new value


def test_set_refuses_an_empty_value_and_revoke_says_when_nothing_was_stored() -> None:
    empty = _cli("set", "dave", "env", "github_token", stdin="")
    assert empty.returncode == 2 and "no value" in empty.stderr
    nothing = _cli("revoke", "nobody-at-all")
    assert nothing.returncode == 1 and "nothing stored" in nothing.stderr


def test_set_with_a_configuration_refuses_a_secret_nothing_would_read(tmp_path) -> None:
    import json

    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"gh": {
        "command": sys.executable, "args": [str(FIXTURES / "env_server.py")], "scope": "per_identity",
        "identity_env": {"GITHUB_TOKEN": "github_token"}}}}))
    typo = _cli("set", "erin", "gh", "gihtub_token", "--config", str(config), stdin="value\n")
    assert typo.returncode == 2 and "names no secret 'gihtub_token'" in typo.stderr and "github_token" in typo.stderr
    unknown = _cli("set", "erin", "nope", "github_token", "--config", str(config), stdin="value\n")
    assert unknown.returncode == 2 and "no server 'nope'" in unknown.stderr
    assert _cli("set", "erin", "gh", "github_token", "--config", str(config), stdin="value\n").returncode == 0
    assert "erin" in _cli("list").stdout


async def test_a_store_key_that_is_not_a_key_refuses_the_process_with_the_fix(monkeypatch) -> None:
    monkeypatch.setenv("BASTION_CREDENTIALS_KEY", "not-a-key")
    entry = {"command": sys.executable, "args": [str(FIXTURES / "env_server.py")], "scope": "per_identity",
             "sandbox": {"profile": "none"}, "identity_env": {"GITHUB_TOKEN": "github_token"}}
    gateway = build_gateway(GatewayConfig(servers={"env": ServerConfig.model_validate(entry)}, policy=None,
                                          guardrails=None))
    gateway.start()
    try:
        await gateway.wait_ready(120)
        with pytest.raises(GatewayError) as refused:
            await _getenv(gateway, ALICE)
        assert "BASTION_CREDENTIALS_KEY is not a 32-byte key" in refused.value.message
    finally:
        await gateway.close()
