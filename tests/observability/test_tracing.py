"""Traces of real gateway processes (``bastion run`` under the SDK's stdio client, ``bastion serve`` under its
Streamable HTTP client), exported over OTLP/HTTP to a real receiver in the test: the span tree of a call, the
client's trace continued from its ``_meta`` or its ``traceparent`` header, the server sent the gateway's upstream
span as parent, a refusal's spans, and with tracing off no span, no OpenTelemetry import, the client's
``_meta.traceparent`` passed on untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.http.conftest import serve_config, stop_bastion
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support import BASTION, READY_TIMEOUT, raw_server

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

DEADLINE = 120
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
POLICY = """
@id("call-raw")
permit (principal, action, resource);

@id("never-crash")
forbid (principal, action == Bastion::Action::"call_tool", resource)
when { resource.name == "crash" };
"""


def _config(tmp_path: Path, *, tracing: dict | None) -> tuple[Path, Path]:
    marks = tmp_path / "marks.txt"
    (tmp_path / "team.cedar").write_text(POLICY)
    settings: dict = {
        "servers": {"raw": raw_server(marks)},
        "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "policy": {"policy_files": ["team.cedar"], "audit": {"path": str(tmp_path / "audit.jsonl")}},
    }
    settings["servers"]["raw"]["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    if tracing is not None:
        settings["tracing"] = tracing
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps(settings))
    return config, marks


def _stdio(config: Path, errlog, mode: str) -> Client:
    # -X importtime: the process lists every module it imports on stderr, so a test sees whether OpenTelemetry was.
    params = StdioServerParameters(command=sys.executable, args=["-X", "importtime", "-m", "bastion", "run",
                                                                 str(config)])
    return Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=DEADLINE)


def _calls_received(marks: Path) -> list[dict]:
    return [json.loads(line[len("call "):]) for line in marks.read_text().splitlines() if line.startswith("call ")]


def _by_name(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


def _call_tree(spans: list[ReceivedSpan], tool: str) -> dict[str, ReceivedSpan]:
    """The spans of one tools/call, each checked to be the child of the one before it: the request, then the
    guardrails that screen it, the policy, the secrets flow guard, the guardrails that read its answer, the call to
    its server."""
    tree = {"request": _by_name(spans, f"tools/call {tool}")}
    parent = tree["request"]
    for step in ("guardrails.screen", "policy", "guardrails.flow", "guardrails", "upstream call"):
        span = _by_name([s for s in spans if s.trace_id == parent.trace_id], step)
        assert span.parent_span_id == parent.span_id, [(s.name, s.span_id, s.parent_span_id) for s in spans
                                                       if s.trace_id == parent.trace_id]
        tree[step] = parent = span
    return tree


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_stdio_call_continues_the_clients_trace_and_hands_the_server_its_upstream_span(tmp_path, mode):
    with OtlpReceiver() as receiver:
        config, marks = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint, "service_name": "gw-test"})
        errors = tmp_path / "stderr.txt"
        with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
            async with _stdio(config, errlog, mode) as client:
                answer = await client.call_tool("raw__echo", {"text": "secret-argument"},
                                                meta={"traceparent": CLIENT_TRACEPARENT, "tracestate": "vendor=1"})
                assert answer.content[0].text == "secret-argument"
                with pytest.raises(MCPError, match="refused by policy"):
                    await client.call_tool("raw__crash", {})
        # The client closed the pipe: the gateway's close flushed its spans.
        spans = receiver.wait_for(lambda got: any(s.name == "tools/call raw__crash" for s in got)
                                  and any(s.name == "upstream call" for s in got))
    assert set(receiver.paths) == {"/v1/traces"}
    tree = _call_tree(spans, "raw__echo")
    request = tree["request"]
    assert request.trace_id == CLIENT_TRACE and request.parent_span_id == CLIENT_SPAN  # the client's trace goes on
    assert request.kind == 2 and tree["upstream call"].kind == 3  # SERVER, CLIENT
    assert request.attributes["gen_ai.tool.name"] == "raw__echo" and request.attributes["bastion.server"] == "raw"
    assert request.attributes["bastion.era"] == ("modern" if mode != "legacy" else "legacy")
    assert request.attributes["bastion.identity_class"] == "configured"
    assert request.attributes["bastion.outcome"] == "complete" and request.service_name == "gw-test"
    # What the server received: the gateway's upstream span as the parent, in the same trace, the state passed on.
    sent = [c for c in _calls_received(marks) if c["params"]["name"] == "echo"]
    assert len(sent) == 1
    meta = sent[0]["params"]["_meta"]
    assert meta["traceparent"] == f"00-{CLIENT_TRACE}-{tree['upstream call'].span_id}-01"
    assert meta["tracestate"] == "vendor=1"
    # Refused by policy: its spans are there, the refusal their status; it never reached the server.
    refusal = _by_name(spans, "tools/call raw__crash")
    policy = next(s for s in spans if s.name == "policy" and s.trace_id == refusal.trace_id)
    assert refusal.status_code == policy.status_code == 2  # ERROR
    assert refusal.attributes["bastion.outcome"] == policy.attributes["bastion.outcome"] == "refused"
    assert not any(s.name == "upstream call" and s.trace_id == refusal.trace_id for s in spans)
    assert refusal.trace_id != CLIENT_TRACE  # no traceparent given: a trace of its own
    # No argument on any span.
    assert "secret-argument" not in repr(spans)
    assert "opentelemetry" in errors.read_text()  # imported when on (the off test's check could fail)


async def test_tracing_off_imports_no_opentelemetry_and_passes_the_clients_trace_context_on(tmp_path):
    config, marks = _config(tmp_path, tracing=None)
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with _stdio(config, errlog, "legacy") as client:
            answer = await client.call_tool("raw__echo", {"text": "hi"},
                                            meta={"traceparent": CLIENT_TRACEPARENT, "baggage": "k=v"})
            assert answer.content[0].text == "hi"
    imported = errors.read_text()
    assert "bastion.compose" in imported  # the import list is there to read, the gateway built
    assert "opentelemetry" not in imported
    meta = _calls_received(marks)[0]["params"]["_meta"]
    assert meta["traceparent"] == CLIENT_TRACEPARENT and meta["baggage"] == "k=v"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_http_takes_the_traceparent_header_and_ignores_hostile_trace_context(tmp_path, mode):
    with OtlpReceiver() as receiver:
        config, marks = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint})
        served = serve_config(config, tmp_path, tmp_path / "events.log")
        try:
            async def call(headers: dict[str, str], meta: dict | None, text: str) -> None:
                async with httpx2.AsyncClient(headers=headers, timeout=DEADLINE) as http:
                    async with Client(streamable_http_client(served.url, http_client=http), mode=mode) as client:
                        answer = await client.call_tool("raw__echo", {"text": text}, meta=meta)
                        assert answer.content[0].text == text

            with anyio.fail_after(DEADLINE):
                await call({"traceparent": CLIENT_TRACEPARENT}, None, "from-header")
                # Hostile: not the W3C form, huge, a forged line; each call still served, in a trace of its own.
                await call({"traceparent": "00-zz-[31m-01", "tracestate": "x" * 9000}, None, "bad-header")
                await call({}, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01\nbastion ERROR forged",
                                "baggage": ["not", "a", "string"]}, "bad-meta")
        finally:
            stop_bastion(served)  # SIGTERM: the gateway closes, and flushes its spans
        spans = receiver.wait_for(lambda got: sum(s.name == "upstream call" for s in got) >= 3)
    assert served.process.returncode == 0
    requests = {s.trace_id: s for s in spans if s.name == "tools/call raw__echo"}
    assert CLIENT_TRACE in requests and requests[CLIENT_TRACE].parent_span_id == CLIENT_SPAN
    assert len(requests) == 3  # the two hostile calls began traces of their own
    assert all(s.service_name == "bastion" for s in spans)
    received = {c["params"]["arguments"]["text"]: c["params"]["_meta"] for c in _calls_received(marks)}
    upstream = {s.trace_id: s.span_id for s in spans if s.name == "upstream call"}
    assert received["from-header"]["traceparent"] == f"00-{CLIENT_TRACE}-{upstream[CLIENT_TRACE]}-01"
    for text in ("bad-header", "bad-meta"):
        trace_id = received[text]["traceparent"].split("-")[1]
        assert trace_id in requests and trace_id != "1" * 32
        assert "baggage" not in received[text]
    logged = (tmp_path / "bastion.stderr").read_text()
    assert "forged" not in logged and "\x1b" not in logged


@pytest.mark.parametrize("endpoint", ["collector:4318", "http://collector", "http://user:hunter2@collector:4318",
                                      "http://collector:4318/?token=hunter2"])
def test_a_bad_endpoint_is_refused_naming_the_key_and_never_echoed(tmp_path, endpoint):
    config, _ = _config(tmp_path, tracing={"otlp_endpoint": endpoint})
    for command in (["check", str(config)], ["run", str(config)]):
        checked = subprocess.run([BASTION, *command], capture_output=True, text=True, timeout=DEADLINE,
                                 stdin=subprocess.DEVNULL)
        assert checked.returncode == 2
        assert "tracing.otlp_endpoint" in checked.stderr and "http://HOST:PORT" in checked.stderr
        assert endpoint not in checked.stderr and "hunter2" not in checked.stderr


def _environment(**extra: str) -> dict[str, str]:
    """What the SDK's stdio client passes by default (the test folders included), and ``extra``."""
    from mcp.client.stdio import get_default_environment

    return {**get_default_environment(), **extra}


async def test_the_otel_variables_are_honoured_when_the_table_names_no_endpoint(tmp_path):
    with OtlpReceiver() as receiver:
        config, _ = _config(tmp_path, tracing={})
        errors = tmp_path / "stderr.txt"
        params = StdioServerParameters(command=BASTION, args=["run", str(config)], env=_environment(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_SERVICE_NAME="from-env"))
        with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=DEADLINE) as client:
                await client.call_tool("raw__echo", {"text": "hi"})
        spans = receiver.wait_for(lambda got: any(s.name == "upstream call" for s in got))
    assert set(receiver.paths) == {"/v1/traces"}
    assert {s.service_name for s in spans} == {"from-env"}


async def test_otel_sdk_disabled_turns_tracing_off_whatever_the_table_says(tmp_path):
    with OtlpReceiver() as receiver:
        config, marks = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint})
        errors = tmp_path / "stderr.txt"
        params = StdioServerParameters(command=sys.executable, args=["-X", "importtime", "-m", "bastion", "run",
                                                                     str(config)],
                                       env=_environment(OTEL_SDK_DISABLED="true"))
        with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=DEADLINE) as client:
                await client.call_tool("raw__echo", {"text": "hi"}, meta={"traceparent": CLIENT_TRACEPARENT})
    # The process has exited: whatever it would have sent was sent before it did.
    assert receiver.spans == []
    text = errors.read_text()
    assert "opentelemetry" not in text and "OTEL_SDK_DISABLED is true" in text
    assert _calls_received(marks)[0]["params"]["_meta"]["traceparent"] == CLIENT_TRACEPARENT


async def test_an_approval_wait_is_a_span_of_the_policys(tmp_path):
    """A call the default policy holds for a person (an untrusted server's): the wait is a span under the policy's,
    ended when the person approved from the queue, before the call to the server."""
    from tests.test_approvals_end_to_end import Client as ApprovalClient, _command_of, run_bastion

    with OtlpReceiver() as receiver:
        config = tmp_path / "bastion.json"
        config.write_text(json.dumps({
            "servers": {"raw": raw_server()}, "ready_timeout": READY_TIMEOUT,
            "tracing": {"otlp_endpoint": receiver.endpoint},
            "policy": {"approval": {"fallback": "queue", "timeout_seconds": 120, "poll_seconds": 0.1,
                                    "queue_dir": str(tmp_path / "queue")},
                       "audit": {"path": str(tmp_path / "audit.jsonl")}},
        }))
        client = ApprovalClient(config, tmp_path / "stderr.log")
        try:
            client.initialize("2025-11-25")
            client.call(1, "raw__echo", {"text": "hello"}, meta={"traceparent": CLIENT_TRACEPARENT})
            _, command = _command_of(client.wait_notice(1))
            assert run_bastion(command).returncode == 0
            assert client.answer(1)["result"]["content"][0]["text"] == "hello"
        finally:
            client.close()
        spans = receiver.wait_for(lambda got: any(s.name == "upstream call" for s in got))
    mine = [s for s in spans if s.trace_id == CLIENT_TRACE]
    policy, wait = _by_name(mine, "policy"), _by_name(mine, "approval wait")
    assert wait.parent_span_id == policy.span_id
    assert wait.attributes == {"bastion.server": "raw", "bastion.asked_in": "queue"}
    assert _by_name(mine, "upstream call").status_code != 2


def test_tracing_keeps_a_calls_arguments_the_clients_bytes_where_nothing_else_reads_them(tmp_path):
    """Policy and guardrails off: a call's arguments reach the server as the client wrote them (an integer wider
    than 64 bits exactly, `1.10` not `1.1`), tracing on or not; the server is sent the gateway's span beside them."""
    from tests.support import RawClient

    with OtlpReceiver() as receiver:
        marks = tmp_path / "marks.txt"
        server = raw_server(marks)
        server["env"]["RAW_SERVER_MARK_CALLS"] = "1"
        config = tmp_path / "bastion.json"
        config.write_text(json.dumps({"servers": {"raw": server}, "policy": "off", "guardrails": "off",
                                      "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
                                      "tracing": {"otlp_endpoint": receiver.endpoint}}))
        client = RawClient(config)
        try:
            client.initialize()
            client.send_bytes(b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"raw__echo",'
                              b'"arguments":{"text":"x","big":123456789012345678901234567890,"f":1.10}}}\n')
            assert client.recv_response(7, timeout=DEADLINE)["result"]["content"][0]["text"] == "x"
        finally:
            client.close()
        spans = receiver.wait_for(lambda got: any(s.name == "upstream call" for s in got))
    line = next(line for line in marks.read_text().splitlines() if line.startswith("call "))
    assert '"big":123456789012345678901234567890' in line and '"f":1.10' in line
    upstream = _by_name(spans, "upstream call")
    sent = json.loads(line[len("call "):])["params"]["_meta"]["traceparent"]
    assert sent.startswith(f"00-{upstream.trace_id}-{upstream.span_id}-")  # a trace of Bastion's: its own flags
    assert _by_name(spans, "tools/call raw__echo").attributes["gen_ai.tool.name"] == "raw__echo"


async def test_sample_ratio_zero_records_only_what_a_clients_sampled_traceparent_asks_for(tmp_path):
    with OtlpReceiver() as receiver:
        config, marks = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint, "sample_ratio": 0})
        errors = tmp_path / "stderr.txt"
        with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
            async with _stdio(config, errlog, "legacy") as client:
                await client.call_tool("raw__echo", {"text": "unsampled"})
                await client.call_tool("raw__echo", {"text": "sampled"}, meta={"traceparent": CLIENT_TRACEPARENT})
        spans = receiver.wait_for(lambda got: any(s.name == "upstream call" for s in got))
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}  # the client's sampled flag is followed, nothing else kept
    sent = {c["params"]["arguments"]["text"]: c["params"]["_meta"]["traceparent"] for c in _calls_received(marks)}
    # The server is still told the trace, its sampled flag (the low bit of the flags) clear.
    assert int(sent["unsampled"].split("-")[3], 16) & 1 == 0
    assert sent["sampled"].split("-")[1] == CLIENT_TRACE and int(sent["sampled"].split("-")[3], 16) & 1 == 1


async def test_concurrent_http_clients_each_continue_their_own_trace(tmp_path):
    with OtlpReceiver() as receiver:
        config, marks = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint})
        served = serve_config(config, tmp_path, tmp_path / "events.log")
        traces = {f"{index:032x}": f"00-{index:032x}-{index:016x}-01" for index in range(1, 5)}
        try:
            async def calls(trace_id: str, traceparent: str) -> None:
                async with httpx2.AsyncClient(headers={"traceparent": traceparent}, timeout=DEADLINE) as http:
                    async with Client(streamable_http_client(served.url, http_client=http), mode="legacy") as client:
                        for round_index in range(3):
                            text = f"{trace_id}:{round_index}"
                            assert (await client.call_tool("raw__echo", {"text": text})).content[0].text == text

            with anyio.fail_after(DEADLINE):
                async with anyio.create_task_group() as group:
                    for trace_id, traceparent in traces.items():
                        group.start_soon(calls, trace_id, traceparent)
        finally:
            stop_bastion(served)
        spans = receiver.wait_for(lambda got: sum(s.name == "upstream call" for s in got) >= 12)
    requests = [s for s in spans if s.name == "tools/call raw__echo"]
    assert sorted(s.trace_id for s in requests) == sorted(list(traces) * 3)
    for call in _calls_received(marks):
        trace_id = call["params"]["arguments"]["text"].split(":")[0]
        assert call["params"]["_meta"]["traceparent"].split("-")[1] == trace_id  # each server call in its own trace


async def test_a_malformed_tracestate_or_baggage_is_dropped_unlogged_and_the_trace_goes_on(tmp_path):
    """OpenTelemetry's own propagators log a malformed member they are given, so a client could write in the
    gateway's log at will: Bastion checks the values first, and drops what is malformed without a word."""
    with OtlpReceiver() as receiver:
        config, marks = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint})
        errors = tmp_path / "stderr.txt"
        params = StdioServerParameters(command=BASTION, args=["run", str(config), "-v"])
        with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=DEADLINE) as client:
                await client.call_tool("raw__echo", {"text": "hi"}, meta={
                    "traceparent": CLIENT_TRACEPARENT, "tracestate": "FORGED-STATE=1",
                    "baggage": "forged baggage=" + "x" * 100})
        spans = receiver.wait_for(lambda got: any(s.name == "upstream call" for s in got))
    assert _by_name(spans, "tools/call raw__echo").trace_id == CLIENT_TRACE
    meta = _calls_received(marks)[0]["params"]["_meta"]
    assert meta["traceparent"].split("-")[1] == CLIENT_TRACE and "tracestate" not in meta and "baggage" not in meta
    logged = errors.read_text()
    assert "FORGED" not in logged and "forged baggage" not in logged
