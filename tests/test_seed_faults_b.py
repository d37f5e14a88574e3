"""The seed's faults, each through real processes: concurrent writers to one resource, a wall clock that jumps, and
an audit trail whose disk fills mid-run.

- **Writers.** Four calls in flight at once update one resource 50 times each (``tests/fixtures/writers_server.py``,
  a thread per call, so their updates interleave); the server numbers its ``notifications/resources/updated`` in
  ``_meta["seq"]``. Every subscriber (a handshake-era ``resources/subscribe``, a 2026-07-28 ``subscriptions/listen``
  with ``resourceSubscriptions``), over stdio and over HTTP, gets all 200, numbered 1 to 200 in order.
- **Clock.** ``bastion run`` under libfaketime, its wall clock jumped hours forward and back while it runs
  (monotonic clocks left alone): a call's timeout fires after its real duration, a rate limit's bucket neither
  refills nor empties because of the jump, and ``bastion serve``'s idle sessions are not ended by it.
- **Disk full.** ``bastion serve --http`` with clients calling while the trail's tmpfs fills, then frees: no crash,
  no hang, every call answered (or refused, naming the setting, under ``on_failure = "refuse"``), and ``bastion
  audit verify`` says intact with the gap counted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import pytest

from tests.http.conftest import IDENTITY_HEADER, Served, serve_config, stop_bastion
from tests.support import FIXTURES, READY_TIMEOUT, RawClient, wait_for
from tests.test_audit_failures import small_disk  # noqa: F401 - the fixture, reused

WRITERS = 4
UPDATES = 50
SERVER = "w"
URI = "mem://counter"
DEADLINE = 120.0
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACCEPT_BOTH = "application/json, text/event-stream"


# ------------------------------------------------------------------------------------------ concurrent writers
def writers_config(tmp_path: Path, **settings: Any) -> Path:
    marks = tmp_path / "marks"
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT, **settings,
        "servers": {SERVER: {"command": sys.executable, "args": [str(FIXTURES / "writers_server.py")],
                             "env": {"WRITERS_SERVER_MARKS": str(marks)}, "sandbox": {"writable": [str(tmp_path)]}}}}))
    return config


def subscribed(tmp_path: Path) -> bool:
    marks = tmp_path / "marks"
    return marks.exists() and f"subscribe {URI}" in marks.read_text().splitlines()


def bump(request_id: Any, writer: str, era: str) -> dict[str, Any]:
    params: dict[str, Any] = {"name": f"{SERVER}__bump", "arguments": {"writer": writer, "times": UPDATES}}
    if era == MODERN:
        params["_meta"] = MODERN_META
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def check_order(updates: list[dict[str, Any]], answers: dict[str, list[int]]) -> None:
    """Every update the server sent, in the order it sent them; each writer's own in the order its call said."""
    assert all(u["uri"] == URI for u in updates)
    assert [u["_meta"]["seq"] for u in updates] == list(range(1, WRITERS * UPDATES + 1))
    for writer, sent in answers.items():
        assert [u["_meta"]["seq"] for u in updates if u["_meta"]["writer"] == writer] == sent


@pytest.mark.parametrize("era", [LEGACY, MODERN])
def test_concurrent_writers_updates_reach_a_stdio_subscriber_in_the_servers_order(tmp_path: Path, era: str) -> None:
    client = RawClient(writers_config(tmp_path), log=tmp_path / "bastion.stderr")
    try:
        if era == LEGACY:
            client.initialize()
            listed = client.request(1, "resources/list", {}, timeout=DEADLINE)
            assert URI in [r["uri"] for r in listed["result"]["resources"]], listed
            assert client.request(2, "resources/subscribe", {"uri": URI}, timeout=DEADLINE) == {
                "jsonrpc": "2.0", "id": 2, "result": {}}
        else:
            client.send({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen", "params": {
                "notifications": {"resourceSubscriptions": [URI]}, "_meta": MODERN_META}})
            acknowledged = client.recv(DEADLINE)
            assert acknowledged["method"] == "notifications/subscriptions/acknowledged", acknowledged
            assert acknowledged["params"]["notifications"]["resourceSubscriptions"] == [URI]
        assert wait_for(lambda: subscribed(tmp_path), DEADLINE)
        for n in range(WRITERS):  # all in flight at once
            client.send(bump(100 + n, f"writer-{n}", era))
        updates: list[dict[str, Any]] = []
        answers: dict[str, list[int]] = {}
        while len(answers) < WRITERS or len(updates) < WRITERS * UPDATES:
            message = client.recv(DEADLINE)
            if message.get("method") == "notifications/resources/updated":
                updates.append(message["params"])
                if era == MODERN:
                    assert message["params"]["_meta"][SUBSCRIPTION_ID] == "listen"
            elif message.get("id") in range(100, 100 + WRITERS):
                answers[f"writer-{message['id'] - 100}"] = json.loads(message["result"]["content"][0]["text"])
    finally:
        code, stderr = client.close()
    assert code == 0, stderr
    check_order(updates, answers)


async def sse_messages(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE response (priming events and heartbeats skipped)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data and "".join(data):
                yield json.loads("\n".join(data))
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


async def legacy_session(http: httpx2.AsyncClient, url: str, who: str) -> dict[str, str]:
    headers = {IDENTITY_HEADER: who, "accept": ACCEPT_BOTH}
    init = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
    assert init.status_code == 200, init.text
    headers = {**headers, "mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": LEGACY}
    done = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202
    return headers


def modern_headers(who: str, method: str, name: str | None = None) -> dict[str, str]:
    return {IDENTITY_HEADER: who, "accept": ACCEPT_BOTH, "mcp-protocol-version": MODERN, "mcp-method": method,
            **({"mcp-name": name} if name else {})}


async def answer_of(response: httpx2.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("application/json"):
        return json.loads(await response.aread())
    async for message in sse_messages(response):
        if "id" in message and "method" not in message:
            return message
    raise AssertionError("the answer stream ended without an answer")


async def write(http: httpx2.AsyncClient, url: str, n: int, era: str) -> tuple[str, list[int]]:
    """One writer's call, in a session (handshake era) or alone (2026-07-28); the sequence numbers it sent."""
    writer = f"writer-{n}"
    if era == LEGACY:
        headers = await legacy_session(http, url, writer)
    else:
        headers = modern_headers(writer, "tools/call", f"{SERVER}__bump")
    async with http.stream("POST", url, headers=headers, json=bump(n, writer, era)) as response:
        answer = await answer_of(response)
    return writer, json.loads(answer["result"]["content"][0]["text"])


async def collect(messages: AsyncIterator[dict[str, Any]], into: list[dict[str, Any]]) -> None:
    async for message in messages:
        if message.get("method") == "notifications/resources/updated":
            into.append(message)
            if len(into) == WRITERS * UPDATES:
                return


async def http_writers_run(served: Served, tmp_path: Path) -> None:
    url = served.url
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE)) as http:
        # A handshake-era subscriber: its session's GET stream carries what it subscribed to.
        headers = await legacy_session(http, url, "legacy-subscriber")
        async with http.stream("GET", url, headers={**headers, "accept": "text/event-stream"}) as standing:
            assert standing.status_code == 200
            subscribe = await http.post(url, headers=headers, json={
                "jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": URI}})
            assert (await answer_of(subscribe)) == {"jsonrpc": "2.0", "id": 1, "result": {}}
            # A 2026-07-28 subscriber: its listen stream.
            listen = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": {
                "notifications": {"resourceSubscriptions": [URI]}, "_meta": MODERN_META}}
            async with http.stream("POST", url, headers=modern_headers("modern-subscriber", "subscriptions/listen"),
                                   json=listen) as listening:
                modern_messages = sse_messages(listening)
                acknowledged = await asyncio.wait_for(anext(modern_messages), DEADLINE)
                assert acknowledged["method"] == "notifications/subscriptions/acknowledged", acknowledged
                assert wait_for(lambda: subscribed(tmp_path), DEADLINE)
                legacy_updates: list[dict[str, Any]] = []
                modern_updates: list[dict[str, Any]] = []
                collecting = [asyncio.create_task(collect(sse_messages(standing), legacy_updates)),
                              asyncio.create_task(collect(modern_messages, modern_updates))]
                written = await asyncio.wait_for(asyncio.gather(
                    *(write(http, url, n, LEGACY if n % 2 else MODERN) for n in range(WRITERS))), DEADLINE)
                await asyncio.wait_for(asyncio.gather(*collecting), DEADLINE)
    answers = dict(written)
    check_order([m["params"] for m in legacy_updates], answers)
    check_order([m["params"] for m in modern_updates], answers)
    assert {m["params"]["_meta"][SUBSCRIPTION_ID] for m in modern_updates} == {"listen-1"}
    assert not any(SUBSCRIPTION_ID in m["params"]["_meta"] for m in legacy_updates)


def test_concurrent_writers_updates_reach_http_subscribers_of_both_eras_in_the_servers_order(tmp_path: Path) -> None:
    served = serve_config(writers_config(tmp_path, http={"identity_header": IDENTITY_HEADER}), tmp_path,
                          tmp_path / "events.log")
    try:
        asyncio.run(http_writers_run(served, tmp_path))
    finally:
        stop_bastion(served)
    assert served.process.returncode == 0, served.stderr.read_text()


# ------------------------------------------------------------------------------------------------ clock jump
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
JUMP_HOURS = 5
CALL_TIMEOUT = 2.0
IDLE_TIMEOUT = 20.0


def faked_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file whose offset (``+0``, ``+5h``, ``-5h``) is the wall clock of the Bastion started next; its monotonic
    clock is left alone (``DONT_FAKE_MONOTONIC``), and read at each call (``FAKETIME_NO_CACHE``)."""
    if not LIBFAKETIME.exists():
        pytest.skip(f"{LIBFAKETIME} is missing: Debian's faketime package (scripts/setup.sh installs it) fakes the "
                    f"gateway's wall clock")
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    for name, value in {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset),
                        "FAKETIME_NO_CACHE": "1", "DONT_FAKE_MONOTONIC": "1"}.items():
        monkeypatch.setenv(name, value)
    return offset


def clock_config(tmp_path: Path, **policy: Any) -> Path:
    from tests.test_audit_failures import PERMIT_ALL

    entry = {"command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), "clock-jump"],
             "env": {"RAW_SERVER_MARKS": str(tmp_path / "marks"), "RAW_SERVER_MARK_CALLS": "1"},
             "sandbox": {"writable": [str(tmp_path)]}, "request_timeout": CALL_TIMEOUT}
    (tmp_path / "all.cedar").write_text(PERMIT_ALL)
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": entry}, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "policy": {"policy_files": ["all.cedar"], "audit": {"path": str(tmp_path / "audit.jsonl")}, **policy}}))
    return config


def calls_marked(tmp_path: Path) -> int:
    marks = tmp_path / "marks"
    return sum(line.startswith("call ") for line in marks.read_text().splitlines()) if marks.exists() else 0


def call_records(tmp_path: Path) -> list[dict[str, Any]]:
    """The trail's tools/call records, in order."""
    from tests.test_audit_failures import records

    return [r for r in records(tmp_path / "audit.jsonl")
            if r["kind"] == "call" and r["what"].get("method") == "tools/call"]


def test_a_calls_timeout_runs_its_real_duration_whichever_way_the_wall_clock_jumps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offset = faked_clock(tmp_path, monkeypatch)
    client = RawClient(clock_config(tmp_path), log=tmp_path / "bastion.stderr")
    try:
        client.initialize()
        timed_out = {}
        for request_id, jump in ((1, f"+{JUMP_HOURS}h"), (2, f"-{JUMP_HOURS}h")):
            started = time.monotonic()
            client.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                         "params": {"name": "raw__slow", "arguments": {}}})
            assert wait_for(lambda: calls_marked(tmp_path) == request_id, DEADLINE)
            offset.write_text(jump + "\n")  # the call is at the server: now the gateway's wall clock jumps
            answer = client.recv_response(request_id, DEADLINE)  # back: it did not wait 5 hours
            timed_out[request_id] = time.monotonic() - started
            assert answer["error"]["code"] == -32003, answer
        # Forward: not at once, but after the timeout's own length.
        assert timed_out[1] >= CALL_TIMEOUT, timed_out
    finally:
        code, stderr = client.close()
    assert code == 0, stderr
    # The jumps were real for the gateway: its audit records carry the wall clock it was shown.
    first, second = call_records(tmp_path)
    assert first["ts"] > time.time() + (JUMP_HOURS - 1) * 3600, first
    assert second["ts"] < time.time() - (JUMP_HOURS - 1) * 3600, second
    assert first["latency_ms"] >= CALL_TIMEOUT * 1000 and second["latency_ms"] >= CALL_TIMEOUT * 1000


def test_a_rate_limits_bucket_neither_refills_nor_empties_when_the_wall_clock_jumps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offset = faked_clock(tmp_path, monkeypatch)
    # Three calls at once, then one every 1,000 s: five hours of wall clock would be 18 of them.
    limit = {"scope": "tool", "match": "raw/echo", "rate": 0.001, "burst": 3}
    client = RawClient(clock_config(tmp_path, rate_limits=[limit]), log=tmp_path / "bastion.stderr")
    outcomes = []
    try:
        client.initialize()

        def echo(request_id: int) -> dict[str, Any]:
            return client.request(request_id, "tools/call", {"name": "raw__echo", "arguments": {"text": "hi"}},
                                  timeout=DEADLINE)

        outcomes.append(echo(1))
        offset.write_text(f"-{JUMP_HOURS}h\n")  # back: a bucket that trusted it would be 18 tokens in debt
        outcomes += [echo(2), echo(3), echo(4)]
        offset.write_text(f"+{JUMP_HOURS}h\n")  # forward: and one that trusted this would be full again
        outcomes += [echo(5)]
    finally:
        code, stderr = client.close()
    assert code == 0, stderr
    assert ["result" in o for o in outcomes] == [True, True, True, False, False], outcomes
    for refused in outcomes[3:]:
        assert refused["error"]["code"] == -32000 and "Rate limit exceeded" in refused["error"]["message"], refused
        assert 0 < refused["error"]["data"]["retryAfterSeconds"] <= 1000, refused
    # The gateway ran under the faked clock: the records of the calls after each jump carry it.
    stamps = [r["ts"] for r in call_records(tmp_path)]
    assert len(stamps) == 5 and stamps[1] < time.time() - (JUMP_HOURS - 1) * 3600 < stamps[0] < stamps[4], stamps



async def ping_after_jumps(served: Served, offset: Path) -> list[int]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE)) as http:
        headers = await legacy_session(http, served.url, "idle")
        statuses = []
        for n, jump in enumerate((f"+{JUMP_HOURS}h", f"-{JUMP_HOURS}h")):
            offset.write_text(jump + "\n")
            if jump.startswith("+"):
                # Quiet past one round of the reaper (every quarter of the idle timeout), far within the timeout: a
                # reaper that trusted the wall clock would end the session now.
                await asyncio.sleep(IDLE_TIMEOUT / 4 + 1)
            ping = await http.post(served.url, headers=headers, json={"jsonrpc": "2.0", "id": n, "method": "ping"})
            statuses.append(ping.status_code)
            assert ping.json() == {"jsonrpc": "2.0", "id": n, "result": {}}, ping.text
        return statuses


def test_an_http_sessions_idle_timeout_is_not_ended_by_a_wall_clock_jump(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offset = faked_clock(tmp_path, monkeypatch)
    # 20 s idle ends a session: five hours of wall clock, forward, must not.
    config = writers_config(tmp_path, http={"identity_header": IDENTITY_HEADER, "session_idle_timeout": IDLE_TIMEOUT})
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    try:
        assert asyncio.run(ping_after_jumps(served, offset)) == [200, 200]
    finally:
        stop_bastion(served)
    assert served.process.returncode == 0, served.stderr.read_text()
    assert "without requests" not in served.stderr.read_text()


# ------------------------------------------------------------------------------------------------ disk full
CALLERS = 3


async def echo_over_http(http: httpx2.AsyncClient, url: str, who: str, text: str) -> dict[str, Any]:
    headers = modern_headers(who, "tools/call", "raw__echo")
    async with http.stream("POST", url, headers=headers, json={"jsonrpc": "2.0", "id": text, "method": "tools/call",
                           "params": {"name": "raw__echo", "arguments": {"text": text}, "_meta": MODERN_META}}) as r:
        return await answer_of(r)


class Callers:
    """Clients that keep calling, each its next call once the last was answered; every answer kept, by phase."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.phase = "before"
        self.answers: list[tuple[str, str, dict[str, Any]]] = []  # (phase, text, answer)
        self._stop = asyncio.Event()

    def count(self, phase: str, answered: bool = False) -> int:
        return sum(1 for p, _, a in self.answers if p == phase and (not answered or "result" in a))

    async def until(self, phase: str, at_least: int, answered: bool = False) -> None:
        while self.count(phase, answered) < at_least:
            await asyncio.sleep(0.02)

    async def run(self) -> None:
        await asyncio.gather(*(self._one(f"caller-{n}") for n in range(CALLERS)))

    def stop(self) -> None:
        self._stop.set()

    async def _one(self, who: str) -> None:
        n = 0
        while not self._stop.is_set():
            phase, text = self.phase, f"{who}-{n}"
            self.answers.append((phase, text, await echo_over_http(self.http, self.url, who, text)))
            n += 1


async def disk_fills_mid_run(served: Served, disk: Path) -> Callers:
    from tests.test_audit_failures import FAILING, RESUMED, fill

    def said(text: str) -> int:
        # The trail's own lines (a refusal quotes the failure too).
        return served.stderr.read_text(errors="replace").count(f"audit.jsonl: {text}")

    async def until_said(failing: bool) -> None:
        # While the filler and the trail's writer race for the last bytes the trail may fail, resume in what its
        # cut-off record freed, and fail again (a gap record each time): what counts is what it said last.
        while not (said(FAILING) > said(RESUMED) if failing else said(FAILING) == said(RESUMED) > 0):
            await asyncio.sleep(0.02)

    async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE)) as http:
        callers = Callers(http, served.url)
        running = asyncio.create_task(callers.run())
        try:
            await asyncio.wait_for(callers.until("before", CALLERS * 2), DEADLINE)
            callers.phase = "filling"
            filler = await asyncio.to_thread(fill, disk)  # not a byte left: nothing can free one but the test
            await asyncio.wait_for(until_said(failing=True), DEADLINE)
            callers.phase = "full"  # the gateway knows: calls keep coming
            await asyncio.wait_for(callers.until("full", CALLERS * 2), DEADLINE)
            callers.phase = "freed"
            filler.unlink()
            await asyncio.wait_for(until_said(failing=False), DEADLINE)
            callers.phase = "resumed"
            await asyncio.wait_for(callers.until("resumed", CALLERS * 2, answered=True), DEADLINE)
        finally:
            callers.stop()
            await asyncio.wait_for(running, DEADLINE)
    return callers


@pytest.mark.parametrize("on_failure", ["continue", "refuse"])
def test_the_audit_trails_disk_fills_mid_run_while_http_clients_keep_calling(
        tmp_path: Path, small_disk: Path, on_failure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_audit_failures import calls_reached, configure, records, verify_json, verify_text

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    audit = small_disk / "trail" / "audit.jsonl"
    config = configure(tmp_path, audit, on_failure=on_failure)
    settings = json.loads(config.read_text())
    config.write_text(json.dumps({**settings, "http": {"identity_header": IDENTITY_HEADER}}))
    served = serve_config(config, tmp_path, tmp_path / "events.log")
    try:
        callers = asyncio.run(disk_fills_mid_run(served, small_disk))
        assert served.process.poll() is None, served.stderr.read_text()  # no crash
    finally:
        stop_bastion(served)
    assert served.process.returncode == 0, served.stderr.read_text()

    # Every call was answered: with its own text, or (refuse) with an error naming the setting and the cause.
    refused = []
    for phase, text, answer in callers.answers:
        if "result" in answer:
            assert answer["result"]["content"][0]["text"] == text, answer
            continue
        assert on_failure == "refuse" and phase != "before", (phase, answer)
        error = answer["error"]
        assert error["code"] == -32001 and error["data"]["rule"] == "policy.audit.on_failure", answer
        assert "No space left on device" in error["message"]
        refused.append(text)
    assert bool(refused) == (on_failure == "refuse")
    if on_failure == "refuse":  # once the gateway knew, until the trail was back, nothing ran
        ran = [(t, a) for p, t, a in callers.answers if p == "full" and "error" not in a]
        assert not ran, ran

    # The trail holds what was written before the disk filled and after it was freed, and counts what is missing.
    trail = records(audit)
    gaps = [r for r in trail if r["kind"] == "gap"]
    assert gaps and all(g["lost"] >= 1 and g["error"] == "No space left on device" for g in gaps), gaps
    called = {r["what"]["arguments"]["text"] for r in trail if r["kind"] == "call" and "arguments" in r["what"]}
    # What was answered before the disk filled is on disk, but for what was still in the writer's hands (counted).
    assert len({t for p, t, _ in callers.answers if p == "before"} - called) <= sum(g["lost"] for g in gaps)
    assert {t for p, t, _ in callers.answers if p == "resumed"} <= called
    reached = set(calls_reached(tmp_path))  # what the server got: no refused call, every answered one
    assert not reached & set(refused)
    assert {t for _, t, a in callers.answers if "result" in a} <= reached
    report = verify_json(audit)
    assert report["status"] == "intact" and report["discontinuities"] == len(gaps), report
    said = verify_text(audit)
    assert f"{gaps[0]['lost']} audit record(s) could not be written" in said and said.rstrip().endswith(": intact")
