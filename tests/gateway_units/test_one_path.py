"""One request path: every tools/call passes the interceptor chain, in a real asyncio Task, and the pass-through
of a call's bytes is a property of that path, chosen where the chain is compiled. In process, against a real
server subprocess, through a client connection on an in-memory transport."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig
from bastion.gateway.core import Gateway
from bastion.frontends.connection import ClientConnection
from bastion.gateway.pipeline import passes_raw
from bastion.model import GatewayError, GatewayRequest, Handler, Identity
from bastion.protocol import jsonrpc

from tests.support import raw_server, wait_for
from tests.fixtures.handed_over import check_handed_over

DEADLINE = 60.0
# Spacing, key order and an integer wider than 64 bits: none of it would survive a decode and re-encode.
UNUSUAL_RESULT = '{ "n" : 123456789012345678901234567890,  "content": [{"type": "text", "text": "z"}], "a": 1 }'
WIDE_ARGUMENTS = b'{"text": "exact", "n": 123456789012345678901234567890, "f": 1.10}'


class Watching:
    """An interceptor that sees every request and declares it reads neither a call's params nor its result."""

    reads_params = False
    reads_results = False

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        self.seen.append(request.method)
        return await call_next(request)


class Reading:
    """An interceptor that declares nothing, so it reads everything: the call is decoded for it."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        result = await call_next(request)
        self.results.append(result)
        return result


class Bounded:
    """An interceptor that runs the rest of the chain under asyncio.timeout, inside a TaskGroup: both need
    the request to be a real Task."""

    methods = frozenset({"tools/call"})
    reads_params = False
    reads_results = False

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        self.tasks.append(asyncio.current_task())
        try:
            async with asyncio.timeout(self.seconds):
                async with asyncio.TaskGroup() as group:
                    answer = group.create_task(call_next(request))
                    noted = group.create_task(asyncio.sleep(0))
        except TimeoutError:
            raise GatewayError(jsonrpc.REQUEST_TIMEOUT, f"the interceptor gave up after {self.seconds:g}s") from None
        assert noted.done()
        return answer.result()


def test_the_chain_says_at_compile_time_whether_a_methods_bytes_pass() -> None:
    class OnlyLists:
        methods = frozenset({"tools/list"})

    assert passes_raw([], "tools/call", "results") and passes_raw([], "tools/call", "params")
    assert passes_raw([Watching()], "tools/call", "results") and passes_raw([Watching()], "tools/call", "params")
    assert passes_raw([OnlyLists()], "tools/call", "results")  # it never looks at a call
    assert not passes_raw([OnlyLists()], "tools/list", "results")
    assert not passes_raw([Watching(), Reading()], "tools/call", "results")  # undeclared: it reads
    assert not passes_raw([Reading()], "tools/call", "params")


class Client:
    def __init__(self, gateway: Gateway) -> None:
        self.lines: list[bytes] = []
        self.arrived = asyncio.Event()
        self.connection = ClientConnection(gateway, self._receive, identity=Identity("local"))

    def _receive(self, frame: bytes, message: Any) -> None:
        check_handed_over(frame, message)
        self.lines.append(frame.rstrip(b"\n"))
        self.arrived.set()

    def send(self, frame: bytes) -> None:
        self.connection.feed(frame)

    async def line_for(self, request_id: Any) -> bytes:
        async def arrived() -> bytes:
            while True:
                for line in self.lines:
                    message = json.loads(line)  # the standard library keeps integers of any width
                    if message.get("id") == request_id and "method" not in message:
                        return line
                self.arrived.clear()
                await self.arrived.wait()

        return await asyncio.wait_for(arrived(), DEADLINE)

    async def handshake(self) -> None:
        self.send(orjson.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
        await self.line_for("init")
        self.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')

    async def call(self, request_id: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.send(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                "params": {"name": name, "arguments": arguments}}))
        return json.loads(await self.line_for(request_id))


@pytest.fixture
async def start(tmp_path: Path):
    gateways: list[Gateway] = []
    marks = tmp_path / "marks.txt"

    async def started(*interceptors: Any) -> tuple[Gateway, Client]:
        server = raw_server(marks, sandbox="none")
        server["env"] = {**server["env"], "RAW_SERVER_ECHO_VERBATIM": "1", "RAW_SERVER_MARK_CALLS": "1"}
        # Neither the policy nor the guardrails: the chain is the interceptors each test gives, and what they read.
        config = GatewayConfig.model_validate({"servers": {"raw": server}, "policy": "off", "guardrails": "off"})
        gateway = build_gateway(config, interceptors=interceptors)
        gateways.append(gateway)
        gateway.start({})
        await gateway.wait_ready()
        client = Client(gateway)
        await client.handshake()
        return gateway, client

    started.marks = marks  # type: ignore[attr-defined]
    yield started
    for gateway in gateways:
        await gateway.close()


async def test_past_an_interceptor_that_reads_nothing_the_bytes_pass_both_ways(start) -> None:
    watching = Watching()
    _, client = await start(watching)
    client.send(b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", '
                b'"params": {"name": "raw__echo", "arguments": {"text": ' + orjson.dumps(UNUSUAL_RESULT) + b'}}}\n')
    line = await client.line_for(3)
    assert line == b'{"jsonrpc":"2.0","id":3,"result":' + UNUSUAL_RESULT.encode() + b"}"
    assert "tools/call" in watching.seen  # it was on the path all the same
    client.send(b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", '
                b'"params": {"name": "raw__echo", "arguments": ' + WIDE_ARGUMENTS.replace(b'"exact"', b'"{}"') + b'}}\n')
    await client.line_for(4)
    calls = [line for line in start.marks.read_text().splitlines() if line.startswith("call ")]
    assert any(('"arguments":' + WIDE_ARGUMENTS.replace(b'"exact"', b'"{}"').decode()) in call for call in calls)
    assert watching.seen.count("tools/call") == 2


async def test_an_interceptor_that_reads_results_gets_them_decoded(start) -> None:
    reading = Reading()
    _, client = await start(reading)
    answer = await client.call(1, "raw__echo", {"text": '{"content": [{"type": "text", "text": "d"}]}'})
    assert answer["result"]["content"][0]["text"] == "d"
    assert reading.results[-1] == {"content": [{"type": "text", "text": "d"}]}
    # Read, an integer wider than 64 bits becomes a float; a number no float holds is a clear error, no hang.
    widened = await client.call(2, "raw__echo", {"text": UNUSUAL_RESULT})
    assert widened["result"]["n"] == float(123456789012345678901234567890)
    refused = await client.call(3, "raw__echo", {"text": '{"content": [], "n": 1e400}'})
    assert refused["error"]["code"] == jsonrpc.INTERNAL_ERROR and "could not be read" in refused["error"]["message"]


async def test_a_request_runs_in_a_real_task_so_timeout_and_task_group_work_in_an_interceptor(start) -> None:
    bounded = Bounded(30)
    _, client = await start(bounded)
    answer = await client.call(1, "raw__echo", {"text": '{"content": [{"type": "text", "text": "in time"}]}'})
    assert answer["result"]["content"][0]["text"] == "in time"
    assert bounded.tasks and all(isinstance(task, asyncio.Task) for task in bounded.tasks)


async def test_an_interceptors_timeout_cancels_the_call_at_its_server(start) -> None:
    _, client = await start(Bounded(0.5))
    answer = await client.call(1, "raw__slow", {})
    assert answer["error"]["code"] == jsonrpc.REQUEST_TIMEOUT and "0.5s" in answer["error"]["message"]
    assert await asyncio.to_thread(wait_for, lambda: "cancelled" in start.marks.read_text())


async def test_many_calls_in_flight_each_get_their_own_answer_and_leave_nothing_behind(start) -> None:
    gateway, client = await start()
    for i in range(20):
        client.send(orjson.dumps({"jsonrpc": "2.0", "id": f"slow-{i}", "method": "tools/call",
                                  "params": {"name": "raw__slow", "arguments": {}}}))
    answers = await asyncio.gather(*(client.call(i, "raw__echo", {"text": orjson.dumps(
        {"content": [{"type": "text", "text": f"t{i}"}]}).decode()}) for i in range(100)))
    assert [a["result"]["content"][0]["text"] for a in answers] == [f"t{i}" for i in range(100)]
    for i in range(20):
        client.send(orjson.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                  "params": {"requestId": f"slow-{i}"}}))
    assert await asyncio.to_thread(wait_for, lambda: start.marks.read_text().count("cancelled") == 20)
    assert len(gateway.upstreams["raw"]._correlator) == 0
    await client.connection.closed()
    assert not client.connection._running
