"""DirectCall, and when the gateway passes a tools/call straight to its server instead of through the pipeline:
in process, against a real server subprocess."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bastion.config import GatewayConfig
from bastion.gateway.core import Gateway
from bastion.gateway.eager import DirectCall
from bastion.model import Identity, Session
from bastion.protocol.jsonrpc import UPSTREAM_UNAVAILABLE, ErrorResponse, RawResponse, Response, parse_raw_request

from tests.support import raw_server, wait_for

SESSION = Session(Identity("local"), "legacy", "2025-11-25", {}, None, "client")


def test_a_direct_call_delivers_its_answer_once_under_the_clients_id() -> None:
    delivered: list[Any] = []
    abandoned: list[Any] = []
    call = DirectCall(lambda *delivery: delivered.append(delivery), abandoned.append, "c-1")
    call.pending = "pending"
    call.settle("answer")
    call.settle("again")
    call.cancel()
    assert delivered == [("c-1", "answer")] and abandoned == [] and call.done


def test_cancelling_a_direct_call_abandons_it_upstream_and_delivers_nothing_to_answer() -> None:
    delivered: list[Any] = []
    abandoned: list[Any] = []
    call = DirectCall(lambda *delivery: delivered.append(delivery), abandoned.append, 5)
    call.pending = "pending"
    call.cancel()
    call.settle("late answer")
    assert abandoned == ["pending"] and delivered == [(5, None)]


async def test_a_cancelled_direct_call_is_finished_at_once() -> None:
    call = DirectCall(lambda *_: None, lambda _: None, 1)
    call.cancel()
    assert (await asyncio.wait_for(call.finished(), 1)) is None


async def _passthrough(request: Any, call_next: Any) -> dict[str, Any]:
    """An interceptor that changes nothing: enough to put the pipeline in the way."""
    return await call_next(request)


class Deliveries:
    def __init__(self) -> None:
        self.answers: dict[Any, Any] = {}
        self.arrived = asyncio.Event()

    def to(self, request_id: Any):
        def deliver(origin_id: Any, answer: Any) -> None:
            assert origin_id == request_id
            self.answers[request_id] = answer
            self.arrived.set()
        return deliver

    async def wait_for(self, request_id: Any) -> Any:
        while request_id not in self.answers:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 20)
        return self.answers[request_id]


async def started(tmp_path: Path, server_env: dict[str, str] | None = None, **gateway_options: Any
                  ) -> tuple[Gateway, Path]:
    marks = tmp_path / "marks.txt"
    server = raw_server(marks, sandbox="none")
    server["env"] = {**server["env"], **(server_env or {})}
    config = GatewayConfig.model_validate({"servers": {"raw": server}, "policy": "off"})  # no interceptor in the way
    gateway = Gateway(config, **gateway_options)
    gateway.start({})
    await gateway.wait_ready()
    return gateway, marks


async def test_with_no_interceptor_a_plain_call_goes_straight_to_its_server_and_back(tmp_path: Path) -> None:
    gateway, _ = await started(tmp_path)
    try:
        deliveries = Deliveries()
        call = gateway.forward_tool_call(SESSION, 1, {"name": "raw__echo", "arguments": {"text": "hi"}}, "debug",
                                         deliveries.to(1))
        assert isinstance(call, DirectCall)
        assert call.resume is None  # a handshake-era server never asks for input: nothing is held for it
        answer = await deliveries.wait_for(1)
        # The result is passed on as the bytes the server sent; decoding it finds the echo.
        assert type(answer) is RawResponse
        assert _text(answer) == "hi"
        assert call.done
    finally:
        await gateway.close()


async def test_calls_that_need_the_pipeline_are_left_to_it(tmp_path: Path) -> None:
    gateway, _ = await started(tmp_path)
    try:
        deliver = Deliveries().to("x")
        assert gateway.forward_tool_call(SESSION, 1, None, "debug", deliver) is None
        assert gateway.forward_tool_call(SESSION, 2, {"name": "raw__nope"}, "debug", deliver) is None  # the pipeline explains it
        assert gateway.forward_tool_call(SESSION, 3, {"name": ["raw__echo"]}, "debug", deliver) is None
        progress = {"name": "raw__echo", "arguments": {}, "_meta": {"progressToken": "p"}}  # the token is remapped
        assert gateway.forward_tool_call(SESSION, 4, progress, "debug", deliver) is None
    finally:
        await gateway.close()

    intercepted, _ = await started(tmp_path, interceptors=[_passthrough])
    try:
        assert intercepted.forward_tool_call(SESSION, 1, {"name": "raw__echo", "arguments": {}}, "debug",
                                             Deliveries().to(1)) is None
    finally:
        await intercepted.close()


async def test_a_cancelled_direct_call_reaches_the_server_as_a_cancellation(tmp_path: Path) -> None:
    gateway, marks = await started(tmp_path)
    try:
        deliveries = Deliveries()
        call = gateway.forward_tool_call(SESSION, 7, {"name": "raw__slow", "arguments": {}}, "debug", deliveries.to(7))
        assert call is not None
        call.cancel()
        assert deliveries.answers == {7: None}
        assert await asyncio.to_thread(wait_for, lambda: "cancelled" in marks.read_text())
    finally:
        await gateway.close()


async def test_a_server_crash_answers_a_direct_call_with_an_error_at_once(tmp_path: Path) -> None:
    gateway, _ = await started(tmp_path)
    try:
        deliveries = Deliveries()
        assert gateway.forward_tool_call(SESSION, 9, {"name": "raw__crash", "arguments": {}}, "debug", deliveries.to(9))
        answer = await deliveries.wait_for(9)
        assert type(answer) is ErrorResponse and answer.error["code"] == UPSTREAM_UNAVAILABLE
        assert "raw" in answer.error["message"]
    finally:
        await gateway.close()


async def test_a_modern_server_gets_the_call_directly_and_keeps_what_a_retry_needs(tmp_path: Path) -> None:
    discover = ('{"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "resultType": "complete", '
                '"_meta": {"io.modelcontextprotocol/serverInfo": {"name": "raw", "version": "1"}}}')
    gateway, _ = await started(tmp_path, {"RAW_SERVER_DISCOVER": discover})
    try:
        assert gateway.upstreams["raw"].era == "modern"
        deliveries = Deliveries()
        call = gateway.forward_tool_call(SESSION, 1, {"name": "raw__echo", "arguments": {"text": "m"}}, "debug",
                                         deliveries.to(1))
        assert isinstance(call, DirectCall)
        # An input_required answer is retried on the same server with the params as sent, under the server's name.
        assert call.resume == ("raw", {"name": "echo", "arguments": {"text": "m"}})
        answer = await deliveries.wait_for(1)
        assert _text(answer) == "m"
    finally:
        await gateway.close()


async def test_many_direct_calls_in_flight_each_get_their_own_answer_and_leave_nothing_behind(tmp_path: Path) -> None:
    gateway, marks = await started(tmp_path)
    try:
        deliveries = Deliveries()
        slow = [gateway.forward_tool_call(SESSION, f"slow-{i}", {"name": "raw__slow", "arguments": {}}, "debug",
                                          deliveries.to(f"slow-{i}")) for i in range(20)]
        for i in range(200):
            assert gateway.forward_tool_call(SESSION, i, {"name": "raw__echo", "arguments": {"text": f"t{i}"}}, "debug",
                                             deliveries.to(i)) is not None
        for call in slow:
            assert call is not None
            call.cancel()
        for i in range(200):
            answer = await deliveries.wait_for(i)
            assert _text(answer) == f"t{i}"
        assert all(deliveries.answers[f"slow-{i}"] is None for i in range(20))
        assert len(gateway.upstreams["raw"]._correlator) == 0
        assert await asyncio.to_thread(wait_for, lambda: marks.read_text().count("cancelled") == 20)
    finally:
        await gateway.close()


def _text(answer: Any) -> str:
    decoded = answer.decoded()
    assert type(decoded) is Response
    return decoded.result["content"][0]["text"]


def _raw_params(params: str) -> dict[str, Any]:
    request = parse_raw_request(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + params.encode() + b"}")
    assert request is not None
    return request.params


async def test_raw_params_go_straight_to_a_handshake_era_server(tmp_path: Path) -> None:
    gateway, _ = await started(tmp_path)
    try:
        deliveries = Deliveries()
        call = gateway.forward_raw_tool_call(SESSION, 1, _raw_params('{"name": "raw__echo", "arguments": {"text": "r"}}'),
                                             "debug", deliveries.to(1))
        assert isinstance(call, DirectCall)
        assert _text(await deliveries.wait_for(1)) == "r"
        deliver = deliveries.to("x")
        for params in ('{"name": "raw__nope", "arguments": {}}', '{"name": ["raw__echo"]}', '{"arguments": {}}',
                       '{"name": "raw__echo", "arguments": {}, "_meta": {"progressToken": 1}}'):
            assert gateway.forward_raw_tool_call(SESSION, 2, _raw_params(params), "debug", deliver) is None, params
    finally:
        await gateway.close()


async def test_raw_params_are_not_sent_to_a_modern_server_or_past_an_interceptor(tmp_path: Path) -> None:
    discover = ('{"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "resultType": "complete", '
                '"_meta": {"io.modelcontextprotocol/serverInfo": {"name": "raw", "version": "1"}}}')
    params = _raw_params('{"name": "raw__echo", "arguments": {"text": "m"}}')
    modern, _ = await started(tmp_path, {"RAW_SERVER_DISCOVER": discover})
    try:  # its envelope is stamped into decoded params: the call is left to forward_tool_call
        assert modern.forward_raw_tool_call(SESSION, 1, params, "debug", Deliveries().to(1)) is None
    finally:
        await modern.close()

    intercepted, _ = await started(tmp_path, interceptors=[_passthrough])
    try:
        assert not intercepted.forwards_directly
        assert intercepted.forward_raw_tool_call(SESSION, 1, params, "debug", Deliveries().to(1)) is None
    finally:
        await intercepted.close()
