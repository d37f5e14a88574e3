"""Per-client state on one gateway: several client connections in process, one real SDK-written server.

A server's request to the client goes to the client whose call caused it (never the most recent one), across
eras; a server notification without an origin reaches only the clients that asked for its kind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig
from bastion.gateway.core import Gateway
from bastion.frontends.connection import ClientConnection
from bastion.model import GatewayError, Identity
from bastion.protocol.jsonrpc import INVALID_REQUEST
from bastion.protocol.versions import LATEST_MODERN, META_CLIENT_CAPABILITIES, META_PROTOCOL_VERSION

from tests.support import FIXTURES
from tests.fixtures.handed_over import check_handed_over

DEADLINE = 90.0  # seconds any one wait may take before the test counts as hung
ANSWER = {"role": "assistant", "content": {"type": "text", "text": "from {name}"}, "model": "m"}
SAMPLING = {"sampling": {}}


class Client:
    """One client on an in-memory transport: it records every frame Bastion sends it and answers sampling."""

    def __init__(self, gateway: Gateway, name: str) -> None:
        self.name = name
        self.frames: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.connection = ClientConnection(gateway, self._receive, identity=Identity(name))
        self._ids = iter(range(1, 10_000))

    def _receive(self, frame: bytes, handed: Any) -> None:
        check_handed_over(frame, handed)
        message = orjson.loads(frame)
        self.frames.append(message)
        self.arrived.set()
        if message.get("method") == "sampling/createMessage":
            answer = {**ANSWER, "content": {"type": "text", "text": f"from {self.name}"}}
            # Answered from the loop, as a real client's answer arrives: never from inside Bastion's own send.
            asyncio.get_running_loop().call_soon(self.send, {"jsonrpc": "2.0", "id": message["id"], "result": answer})

    def send(self, message: dict[str, Any]) -> None:
        self.connection.feed(orjson.dumps(message))

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.answer(request_id)

    async def answer(self, request_id: Any) -> dict[str, Any]:
        async def arrived() -> dict[str, Any]:
            while True:
                for message in self.frames:
                    if message.get("id") == request_id and ("result" in message or "error" in message):
                        return message
                self.arrived.clear()
                await self.arrived.wait()

        return await asyncio.wait_for(arrived(), DEADLINE)

    async def wait_for(self, method: str) -> dict[str, Any]:
        async def arrived() -> dict[str, Any]:
            while True:
                found = self.received(method)
                if found:
                    return found[0]
                self.arrived.clear()
                await self.arrived.wait()

        return await asyncio.wait_for(arrived(), DEADLINE)

    def received(self, method: str) -> list[dict[str, Any]]:
        return [m for m in self.frames if m.get("method") == method]


async def legacy(gateway: Gateway, name: str, capabilities: dict[str, Any]) -> Client:
    client = Client(gateway, name)
    answer = await client.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": capabilities,
                                              "clientInfo": {"name": name, "version": "1"}})
    assert "result" in answer
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return client


def modern(gateway: Gateway, name: str) -> Client:
    return Client(gateway, name)


def envelope(capabilities: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"_meta": {META_PROTOCOL_VERSION: LATEST_MODERN, META_CLIENT_CAPABILITIES: capabilities, **meta}}


def text(answer: dict[str, Any]) -> str:
    return answer["result"]["content"][0]["text"]


@pytest.fixture
async def gateway(tmp_path: Path):
    config = GatewayConfig.model_validate({"policy": "off", "ready_timeout": 60, "servers": {"fx": {
        "command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": "legacy",
        "env": {"FIXTURE_EVENTS": str(tmp_path / "events.log")}, "sandbox": "none", "request_timeout": 300}}})
    gateway = build_gateway(config)
    gateway.start()
    await gateway.wait_ready()
    assert gateway.upstreams["fx"].ready.is_set()
    try:
        yield gateway
    finally:
        await gateway.close()


async def test_a_servers_request_goes_to_the_client_whose_call_caused_it_not_the_most_recent(gateway: Gateway) -> None:
    first = await legacy(gateway, "first", SAMPLING)
    second = await legacy(gateway, "second", SAMPLING)  # connected last: the one a "most recent" rule would pick
    answer = await first.call("tools/call", {"name": "fx__test_sampling", "arguments": {"prompt": "2+2?"}})
    assert text(answer) == "LLM response: from first"
    assert len(first.received("sampling/createMessage")) == 1 and second.received("sampling/createMessage") == []
    answer = await second.call("tools/call", {"name": "fx__test_sampling", "arguments": {"prompt": "3+3?"}})
    assert text(answer) == "LLM response: from second"
    assert len(first.received("sampling/createMessage")) == 1 and len(second.received("sampling/createMessage")) == 1


async def test_a_caller_that_did_not_declare_the_capability_is_refused_even_if_another_client_did(
        gateway: Gateway) -> None:
    able = await legacy(gateway, "able", SAMPLING)
    unable = await legacy(gateway, "unable", {})
    answer = await unable.call("tools/call", {"name": "fx__test_sampling", "arguments": {"prompt": "2+2?"}})
    refusal = answer["error"]["message"] if "error" in answer else text(answer)
    assert "sampling" in refusal
    assert able.received("sampling/createMessage") == [] and unable.received("sampling/createMessage") == []


async def test_a_modern_caller_is_asked_by_input_required_while_a_legacy_client_waits_untouched(
        gateway: Gateway) -> None:
    bystander = await legacy(gateway, "bystander", SAMPLING)
    caller = modern(gateway, "caller")
    params = {"name": "fx__test_sampling", "arguments": {"prompt": "2+2?"}, **envelope(SAMPLING)}
    first = await caller.call("tools/call", params)
    result = first["result"]
    assert result["resultType"] == "input_required"
    [(key, question)] = result["inputRequests"].items()
    assert question["method"] == "sampling/createMessage"
    assert question["params"]["messages"][0]["content"]["text"] == "2+2?"
    assert bystander.received("sampling/createMessage") == []
    retry = {**params, "inputResponses": {key: {**ANSWER, "content": {"type": "text", "text": "four"}}},
             "requestState": result["requestState"]}
    final = await caller.call("tools/call", retry)
    assert final["result"]["resultType"] == "complete" and text(final) == "LLM response: four"
    assert bystander.received("sampling/createMessage") == []
    # The state was for one retry: it names nothing now.
    again = await caller.call("tools/call", retry)
    assert "requestState" in again["error"]["message"]


async def test_request_state_is_bound_to_the_identity_that_made_the_call(gateway: Gateway) -> None:
    caller, other = modern(gateway, "caller"), modern(gateway, "other")
    params = {"name": "fx__test_sampling", "arguments": {"prompt": "2+2?"}, **envelope(SAMPLING)}
    result = (await caller.call("tools/call", params))["result"]
    [key] = result["inputRequests"]
    stolen = {**params, "inputResponses": {key: ANSWER}, "requestState": result["requestState"]}
    refused = await other.call("tools/call", stolen)
    assert "requestState" in refused["error"]["message"]
    # A retry is checked as the call it names: it must name the call its requestState continues.
    elsewhere = await caller.call("tools/call", {**stolen, "name": "fx__test_simple_text"})
    assert "another call" in elsewhere["error"]["message"]
    finished = await caller.call("tools/call", {**stolen})
    assert text(finished) == "LLM response: from {name}"


async def test_a_modern_caller_without_the_capability_is_refused_clearly(gateway: Gateway) -> None:
    caller = modern(gateway, "caller")
    answer = await caller.call("tools/call", {"name": "fx__test_sampling", "arguments": {"prompt": "x"},
                                              **envelope({})})
    refusal = answer["error"]["message"] if "error" in answer else text(answer)
    assert "sampling" in refusal and answer.get("result", {}).get("resultType") != "input_required"


async def test_list_changed_reaches_only_the_clients_that_asked_for_it(gateway: Gateway) -> None:
    handshake_era = await legacy(gateway, "legacy", {})
    silent = modern(gateway, "silent")
    listening = modern(gateway, "listening")
    assert "result" in await silent.call("tools/list", envelope({}))
    listening.send({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen",
                    "params": {"notifications": {"toolsListChanged": True}, **envelope({})}})
    await listening.wait_for("notifications/subscriptions/acknowledged")
    await handshake_era.call("tools/call", {"name": "fx__test_add_dynamic_tool", "arguments": {}})
    await handshake_era.wait_for("notifications/tools/list_changed")
    changed = await listening.wait_for("notifications/tools/list_changed")
    assert changed["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "listen"
    assert silent.received("notifications/tools/list_changed") == []


async def test_log_messages_reach_only_the_clients_that_asked_for_logs(gateway: Gateway) -> None:
    handshake_era = await legacy(gateway, "legacy", {})  # every level until it sets one, as a legacy server does
    quiet = modern(gateway, "quiet")
    assert "result" in await quiet.call("tools/list", envelope({}))
    await handshake_era.call("tools/call", {"name": "fx__test_tool_with_logging", "arguments": {}})
    while len(handshake_era.received("notifications/message")) < 3:
        handshake_era.arrived.clear()
        await asyncio.wait_for(handshake_era.arrived.wait(), DEADLINE)
    assert quiet.received("notifications/message") == []


async def test_a_log_message_during_one_clients_call_is_not_shown_to_another(gateway: Gateway) -> None:
    caller = await legacy(gateway, "caller", {})
    other = await legacy(gateway, "other", {})  # asked for logs too (every level, no setLevel), but has no call
    await caller.call("tools/call", {"name": "fx__test_tool_with_logging", "arguments": {}})
    while len(caller.received("notifications/message")) < 3:
        caller.arrived.clear()
        await asyncio.wait_for(caller.arrived.wait(), DEADLINE)
    assert other.received("notifications/message") == []


class SamplingGuard:
    """An interceptor on the path of servers' sampling requests: it names the method in ``methods``."""

    methods = frozenset({"sampling/createMessage"})
    reads_params = False
    reads_results = False

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.seen: list[tuple[str, str | None, str]] = []

    async def __call__(self, request: Any, call_next: Any) -> Any:
        if request.method == "sampling/createMessage":
            self.seen.append((request.session.identity.name, request.server, request.params["messages"][0]["content"]["text"]))
            if self.refuse:
                raise GatewayError(INVALID_REQUEST, "sampling refused by the guard")
        return await call_next(request)


@pytest.mark.parametrize("refuse", [False, True])
async def test_a_servers_request_to_the_client_passes_the_interceptors_that_name_it(tmp_path: Path, refuse: bool) -> None:
    guard = SamplingGuard(refuse)
    config = GatewayConfig.model_validate({"policy": "off", "ready_timeout": 60, "servers": {"fx": {
        "command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": "legacy",
        "env": {"FIXTURE_EVENTS": str(tmp_path / "events.log")}, "sandbox": "none", "request_timeout": 300}}})
    gateway = build_gateway(config, interceptors=[guard])
    gateway.start()
    await gateway.wait_ready()
    try:
        caller = await legacy(gateway, "caller", SAMPLING)
        answer = await caller.call("tools/call", {"name": "fx__test_sampling", "arguments": {"prompt": "2+2?"}})
        assert guard.seen == [("caller", "fx", "2+2?")]
        if refuse:
            assert caller.received("sampling/createMessage") == []
            refusal = answer["error"]["message"] if "error" in answer else text(answer)
            assert "refused by the guard" in refusal
        else:
            assert text(answer) == "LLM response: from caller"
    finally:
        await gateway.close()


class NoticeGuard:
    """An interceptor on the path of server notifications: it rewrites log messages and drops progress."""

    methods = frozenset({"notifications/message", "notifications/progress"})
    reads_params = True
    reads_results = False

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []

    async def __call__(self, request: Any, call_next: Any) -> Any:
        if request.method not in self.methods:  # the client's own calls pass the chain too
            return await call_next(request)
        self.seen.append((request.method, request.server, request.session.identity.name))
        if request.method == "notifications/progress":
            return {}
        await asyncio.sleep(0)  # an interceptor may await: the notification still arrives, in order
        return await call_next(dataclasses.replace(
            request, params={**request.params, "data": f"checked: {request.params['data']}"}))


@pytest.fixture
async def guarded(tmp_path: Path):
    guard = NoticeGuard()
    config = GatewayConfig.model_validate({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": 60, "servers": {"fx": {
        "command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": "legacy",
        "env": {"FIXTURE_EVENTS": str(tmp_path / "events.log")}, "sandbox": "none", "request_timeout": 300}}})
    gateway = Gateway(config, interceptors=[guard])
    gateway.start()
    await gateway.wait_ready()
    try:
        yield gateway, guard
    finally:
        await gateway.close()


async def test_an_interceptor_that_names_notifications_message_rewrites_a_servers_log(guarded: Any) -> None:
    gateway, guard = guarded
    caller = await legacy(gateway, "caller", {})
    other = await legacy(gateway, "other", {})
    await caller.call("tools/call", {"name": "fx__test_tool_with_logging", "arguments": {}})
    while len(caller.received("notifications/message")) < 3:
        caller.arrived.clear()
        await asyncio.wait_for(caller.arrived.wait(), DEADLINE)
    assert [m["params"]["data"] for m in caller.received("notifications/message")] == [
        "checked: Tool execution started", "checked: Tool processing data", "checked: Tool execution completed"]
    assert {m["params"]["logger"] for m in caller.received("notifications/message")} == {"fx/conformance-test-server"}
    assert guard.seen == [("notifications/message", "fx", "caller")] * 3
    # Still routed by the call that caused it, though delivered after the interceptor's await.
    assert other.received("notifications/message") == []


async def test_an_interceptor_that_names_notifications_progress_drops_it(guarded: Any) -> None:
    gateway, guard = guarded
    caller = await legacy(gateway, "caller", {})
    answer = await caller.call("tools/call", {"name": "fx__test_tool_with_progress", "arguments": {},
                                              "_meta": {"progressToken": "p1"}})
    assert text(answer) == "progress reported"
    while len(guard.seen) < 3:
        await asyncio.sleep(0.05)
    assert guard.seen == [("notifications/progress", "fx", "caller")] * 3
    await asyncio.sleep(0.2)
    assert caller.received("notifications/progress") == []


async def test_without_an_interceptor_naming_it_progress_reaches_the_caller(gateway: Gateway) -> None:
    caller = await legacy(gateway, "caller", {})
    await caller.call("tools/call", {"name": "fx__test_tool_with_progress", "arguments": {},
                                     "_meta": {"progressToken": "p1"}})
    while len(caller.received("notifications/progress")) < 3:
        caller.arrived.clear()
        await asyncio.wait_for(caller.arrived.wait(), DEADLINE)
    assert [m["params"]["progressToken"] for m in caller.received("notifications/progress")] == ["p1"] * 3
