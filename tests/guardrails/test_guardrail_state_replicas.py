"""What the guardrails remember between requests, shared by replicas: two gateways built in one process by
``build_gateway`` on one ``MemoryStore`` stand for two replicas on one Redis. A 2026-07-28 caller's requests go to
either (each is a session of its own), and what one replica learnt of the caller holds its call on the other: the
taint of an answer, the values an answer carried, a server's consent budget. Each decision is also made on a gateway
with a store of its own, which must not know, so that the test fails when the memory is per process.

Then the store gone: a store that cannot be reached (``StateUnavailable``, as the Redis store raises it) makes each
guardrail fail closed and say why."""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, load_config
from bastion.gateway.core import Gateway
from bastion.state import MemoryStore, StateUnavailable
from tests.gateway_units.test_client_routing import Client, envelope, modern, text
from tests.guardrails.cross_server_support import cross_server_setup
from tests.support import FIXTURES

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

TICKET = "web-7f3a9c2e71b04d5e"  # what web's open_ticket answers carry
ELICITATION = {"elicitation": {"form": {}}}


@asynccontextmanager
async def replicas(config: GatewayConfig, stores: Sequence[Any]) -> AsyncIterator[list[Gateway]]:
    """One gateway per store, started and ready; the same store twice makes two replicas of one gateway."""
    gateways = [build_gateway(config, state=store) for store in stores]
    try:
        for gateway in gateways:
            gateway.start()
        for gateway in gateways:
            await gateway.wait_ready()
        yield gateways
    finally:
        for gateway in gateways:
            await gateway.close()


def cross_server(tmp_path: Path, **guardrails: str) -> GatewayConfig:
    # No policy: what holds a call is the guardrails' doing alone. Notes is trusted, so its answers taint nothing;
    # for flow it stands for a server a value can leave the machine through (marked untrusted).
    notes_trust = "untrusted" if guardrails.get("taint") == "off" else "trusted"
    setup = cross_server_setup(tmp_path, {"web": {}, "notes": {"trust": notes_trust}}, policy="off",
                               guardrails=guardrails)
    return load_config(setup.config, log_notes=False)


async def call(client: Client, name: str, arguments: dict[str, Any],
               capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    return await client.call("tools/call", {"name": name, "arguments": arguments, **envelope(capabilities or {})})


def refusal(answer: dict[str, Any]) -> str:
    assert "error" in answer, answer
    return answer["error"]["message"]


# ------------------------------------------------------------------------------------------ shared
async def test_taint_from_an_answer_on_one_replica_holds_the_callers_call_on_the_other(tmp_path: Path) -> None:
    shared, own = MemoryStore(), MemoryStore()
    async with replicas(cross_server(tmp_path), [shared, shared, own]) as (a, b, alone):
        assert "the weather is fine" in text(await call(modern(a, "alice"), "web__fetch_page", {"url": "x"}))
        held = refusal(await call(modern(b, "alice"), "notes__write_note", {"text": "tainted"}))
        assert "web__fetch_page" in held and "'write_note' on server 'notes' is not read-only" in held
        # Another caller on the same replica, and the same caller on a gateway of its own store, were never tainted.
        assert text(await call(modern(b, "bob"), "notes__write_note", {"text": "bob"})) == "wrote bob"
        assert text(await call(modern(alone, "alice"), "notes__write_note", {"text": "own"})) == "wrote own"


async def test_a_reload_forgets_nothing_the_guardrails_remember(tmp_path: Path) -> None:
    # A reload builds new guardrails (here: a changed setting of theirs) on the gateway's store.
    config = cross_server(tmp_path)
    async with replicas(config, [MemoryStore()]) as (gateway,):
        assert "the weather is fine" in text(await call(modern(gateway, "alice"), "web__fetch_page", {"url": "x"}))
        written = json.loads((tmp_path / "bastion.json").read_text())
        written["guardrails"]["cross_server"] = {"approval_timeout_seconds": 30}
        (tmp_path / "bastion.json").write_text(json.dumps(written))
        outcome = await gateway.reload()
        assert outcome.applied and "guardrails" in outcome.describe(), outcome
        held = refusal(await call(modern(gateway, "alice"), "notes__write_note", {"text": "tainted"}))
        assert "web__fetch_page" in held


async def test_a_value_from_an_answer_on_one_replica_is_held_on_the_other(tmp_path: Path) -> None:
    shared, own = MemoryStore(), MemoryStore()
    async with replicas(cross_server(tmp_path, taint="off"), [shared, shared, own]) as (a, b, alone):
        assert TICKET in text(await call(modern(a, "alice"), "web__open_ticket", {}))
        held = refusal(await call(modern(b, "alice"), "notes__write_note", {"text": TICKET}))
        assert "'web' (1 value)" in held and "no person could be asked" in held
        assert text(await call(modern(alone, "alice"), "notes__write_note", {"text": TICKET})) == f"wrote {TICKET}"


def elicitation_config(tmp_path: Path) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "policy": "off", "ready_timeout": 60,
        "guardrails": {"consent": {"max_requests": 1, "window_seconds": 3600},
                       "sampling_budget": {"requests_per_minute": 1},
                       "pins": {"path": str(tmp_path / "pins.json")}},
        "servers": {"fx": {"command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": "legacy",
                           "env": {"FIXTURE_EVENTS": str(tmp_path / "events.log")}, "sandbox": "none",
                           "request_timeout": 300}}})


async def ask(gateway: Gateway, caller: str) -> dict[str, Any]:
    return await call(modern(gateway, caller), "fx__test_elicitation", {"message": "Proceed?"}, ELICITATION)


async def test_a_consent_budget_spent_on_one_replica_is_spent_on_the_other(tmp_path: Path) -> None:
    shared, own = MemoryStore(), MemoryStore()
    async with replicas(elicitation_config(tmp_path), [shared, shared, own]) as (a, b, alone):
        first = await ask(a, "alice")
        assert first["result"]["resultType"] == "input_required"  # the server's question, passed on to alice
        over = await ask(b, "alice")
        assert "over the budget of 1 within 3600 s" in str(over)
        assert (await ask(b, "bob"))["result"]["resultType"] == "input_required"
        assert (await ask(alone, "alice"))["result"]["resultType"] == "input_required"


async def sample(gateway: Gateway, caller: str) -> dict[str, Any]:
    return await call(modern(gateway, caller), "fx__test_sampling", {"prompt": "2+2?"}, {"sampling": {}})


async def test_a_sampling_budget_spent_on_one_replica_is_spent_on_the_other(tmp_path: Path) -> None:
    shared, own = MemoryStore(), MemoryStore()
    async with replicas(elicitation_config(tmp_path), [shared, shared, own]) as (a, b, alone):
        assert (await sample(a, "alice"))["result"]["resultType"] == "input_required"
        over = await sample(b, "alice")
        assert "over the budget of 1 requests a minute" in str(over)
        assert (await sample(b, "bob"))["result"]["resultType"] == "input_required"
        assert (await sample(alone, "alice"))["result"]["resultType"] == "input_required"


# ------------------------------------------------------------------------------------------ unreachable
class Unreachable(MemoryStore):
    """A store every operation of which fails as the Redis store's do when Redis is gone; ``reachable`` turns it
    back into a working memory store (Redis back)."""

    def __init__(self) -> None:
        super().__init__()
        self.reachable = False

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name in _OPERATIONS and not super().__getattribute__("reachable"):
            async def refuse(*args: Any, **kwargs: Any) -> Any:
                raise StateUnavailable("redis://127.0.0.1:1/0: connection refused")
            return refuse
        return found


_OPERATIONS = frozenset({"claim", "recorded", "get", "put", "delete", "map_get", "map_all", "map_put", "map_delete",
                         "add", "take", "hit", "append", "read_after", "publish", "subscribe", "ping"})


async def test_taint_fails_closed_when_the_store_cannot_be_reached_and_recovers(tmp_path: Path) -> None:
    store = Unreachable()
    async with replicas(cross_server(tmp_path), [store]) as (gateway,):
        held = refusal(await call(modern(gateway, "alice"), "notes__write_note", {"text": "blind"}))
        assert "the shared state cannot be reached" in held and "connection refused" in held
        # A read-only call changes nothing: it passes, but an answer that taints cannot be remembered, so it is
        # withheld rather than let the caller's next request forget it.
        withheld = refusal(await call(modern(gateway, "alice"), "web__fetch_page", {"url": "x"}))
        assert "withheld" in withheld and "the shared state cannot be reached" in withheld
        assert "tide: a word" in text(await call(modern(gateway, "alice"), "notes__lookup", {"word": "tide"}))
        store.reachable = True  # back: decided as ever, with nothing to restart
        assert text(await call(modern(gateway, "alice"), "notes__write_note", {"text": "seen"})) == "wrote seen"
    assert "write_note blind" not in (tmp_path / "events.log").read_text()


async def test_flow_fails_closed_when_the_store_cannot_be_reached(tmp_path: Path) -> None:
    store = Unreachable()
    async with replicas(cross_server(tmp_path, taint="off"), [store]) as (gateway,):
        withheld = refusal(await call(modern(gateway, "alice"), "web__open_ticket", {}))
        assert "withheld" in withheld and "the shared state cannot be reached" in withheld
        held = refusal(await call(modern(gateway, "alice"), "notes__write_note", {"text": TICKET}))
        assert "the shared state cannot be reached" in held and "no person could be asked" in held
        # Arguments without a distinctive value need no memory: they pass.
        assert text(await call(modern(gateway, "alice"), "notes__write_note", {"text": "hello"})) == "wrote hello"


async def test_consent_and_sampling_budgets_fail_closed_when_the_store_cannot_be_reached(tmp_path: Path) -> None:
    store = Unreachable()
    async with replicas(elicitation_config(tmp_path), [store]) as (gateway,):
        for answer in (str(await ask(gateway, "alice")), str(await sample(gateway, "alice"))):
            assert "the shared state cannot be reached" in answer and "input_required" not in answer
