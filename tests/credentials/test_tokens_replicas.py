"""Upstream tokens across replicas: with a store the replicas share, the encrypted token document is kept there
(bastion/credentials/state_store.py). Two gateways built in one process on one shared store are two replicas in
front of one real remote server that checks every token at a real authorization server (token exchange)."""

from __future__ import annotations

import asyncio
import base64
import secrets
from typing import Any

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.credentials.state_store import DOCUMENT_KEY, StateTokenStore
from bastion.credentials.store import KEY_VARIABLE, TokenSet
from bastion.model import GatewayError
from bastion.policy.config import PolicyStartError
from bastion.transport.credentials import CredentialsError
from tests.credentials.conftest import client_auth
from tests.credentials.test_token_exchange import call, caller, exchanges
from tests.state.shared_memory import SharedMemoryStore


def new_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> bytes:
    text = new_key()
    monkeypatch.setenv(KEY_VARIABLE, text)
    return base64.b64decode(text)


@pytest.fixture
async def replicas():
    made = []

    async def start(store: Any, upstream_url: str, auth: dict[str, Any]):
        entry = {"url": upstream_url, "scope": "per_identity", "auth": auth}
        gateway = build_gateway(GatewayConfig(servers={"up": ServerConfig.model_validate(entry)}, policy=None,
                                              guardrails=None), state=store)
        made.append(gateway)
        gateway.start()
        await gateway.wait_ready(120)
        assert gateway.upstreams["up"].ready.is_set(), gateway.upstreams["up"].failure
        return gateway

    yield start
    for gateway in made:
        await gateway.close()


async def test_a_token_got_on_one_replica_is_used_by_the_other_and_a_revocation_holds_on_both(
        authorization_server, bearer_server, replicas, key) -> None:
    store = SharedMemoryStore()
    upstream = bearer_server(authorization_server.issuer)
    auth = client_auth(authorization_server.issuer, "token_exchange")
    a, b = await replicas(store, upstream.url, auth), await replicas(store, upstream.url, auth)
    alice = caller(authorization_server, "alice")
    assert (await call(a, alice))["content"][0]["text"] == "alice"
    assert (await call(b, alice))["content"][0]["text"] == "alice"
    assert len(exchanges(authorization_server)) == 1  # B sent the token A got

    raw = await store.get(DOCUMENT_KEY)
    token = (await StateTokenStore(store, key).get_async("up", "alice")).access_token
    assert raw is not None and token.encode() not in raw and b"alice" not in raw and b"access_token" not in raw

    assert await StateTokenStore(store, key).delete_async("up", "alice") == 1  # revoked through any replica
    assert (await call(a, alice))["content"][0]["text"] == "alice"
    assert len(exchanges(authorization_server)) == 2
    sent = [e["authorization"] for e in upstream.seen() if e["claims"] and e["claims"]["sub"] == "alice"]
    assert len(set(sent)) == 2  # the revoked token was not sent again

    store.down = True  # the store gone: a call needing a token is refused, saying why; nothing crashes
    with pytest.raises(GatewayError) as refused:
        await call(b, caller(authorization_server, "bob"))
    assert "shared state store" in refused.value.message


async def test_replicas_sharing_a_store_refuse_to_start_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    entry = {"url": "http://127.0.0.1:9/mcp", "scope": "per_identity",
             "auth": client_auth("http://127.0.0.1:9", "token_exchange")}
    config = GatewayConfig(servers={"up": ServerConfig.model_validate(entry)}, policy=None, guardrails=None)
    with pytest.raises(PolicyStartError, match=f"servers up keep upstream tokens: {KEY_VARIABLE} is not set"):
        build_gateway(config, state=SharedMemoryStore())
    gateway = build_gateway(config)  # one host, the memory store: the key file of the state directory will do
    await gateway.close()


async def test_concurrent_changes_on_two_replicas_lose_nothing(key) -> None:
    store = SharedMemoryStore()
    a, b = StateTokenStore(store, key), StateTokenStore(store, key)
    await asyncio.gather(*(replica.put_async("up", f"user{n}", TokenSet(f"token-{n}"))
                           for n, replica in enumerate([a, b] * 10)))
    for n in range(20):
        assert (await a.get_async("up", f"user{n}")).access_token == f"token-{n}"


async def test_a_replica_with_another_key_reads_nothing_and_says_which_variable(key) -> None:
    store = SharedMemoryStore()
    await StateTokenStore(store, key).put_async("up", "alice", TokenSet("secret-token"))
    with pytest.raises(CredentialsError, match=KEY_VARIABLE):
        await StateTokenStore(store, base64.b64decode(new_key())).get_async("up", "alice")
