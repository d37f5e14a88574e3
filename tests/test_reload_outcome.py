"""``Gateway.reload``, the hook the web console calls, in process with real servers: what its outcome says when a
reload is applied and when it is refused, that an operator's reload is audited under their identity, that two
reloads asked at once run one after the other, and that a gateway without a file says so."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from bastion.compose import build_gateway
from bastion.config import default_config, load_config
from bastion.model import GatewayError, GatewayRequest, Identity, Session
from tests.support import FIXTURES

SERVER = str(FIXTURES / "reload_server.py")
OPERATOR = Identity("ops-alice", ("admins",), authenticated_by="oauth", issuer="https://id.example")


def write(config: Path, names: tuple[str, ...], **settings) -> None:
    config.write_text(json.dumps({
        "tools": {"exposure": "all"}, "guardrails": {"pinning": "off"}, "reload": {"watch": False},
        "policy": {"audit": {"path": str(config.parent / "audit.jsonl")}, "policy_files": ["rules.cedar"]},
        "servers": {name: {"command": sys.executable, "args": [SERVER, name], "sandbox": "none"} for name in names},
        **settings}))


async def test_the_outcome_says_what_a_reload_did_and_why_one_was_refused(tmp_path: Path) -> None:
    (tmp_path / "rules.cedar").write_text('@id("all")\npermit (principal, action, resource);\n')
    config = tmp_path / "bastion.json"
    write(config, ("a",))
    gateway = build_gateway(load_config(config))
    gateway.start()
    try:
        await gateway.wait_ready(120)
        write(config, ("a", "b"), page_size=5, max_message_bytes=65536,
              state={"url": "redis://127.0.0.1:1/0"})  # nothing listens there: a reload never connects
        applied = await gateway.reload(identity=OPERATOR, cause="the console")
        assert applied.applied and applied.error is None
        assert (applied.added, applied.removed, applied.restarted) == (("b",), (), ())
        assert applied.policy_reloaded and applied.needs_restart == ("max_message_bytes", "state")
        assert gateway.config.page_size == 5  # applied
        assert gateway.config.max_message_bytes != 65536  # kept until a restart
        assert gateway.config.state is None and not gateway.state.shared  # the store it started with
        await gateway.wait_ready(120)
        session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "test")
        result = await gateway.handle(GatewayRequest("tools/call", {"name": "b__hello", "arguments": {}}, session,
                                                     gateway.catalog))
        assert result["content"][0]["text"] == "hello from b"

        (tmp_path / "rules.cedar").write_text("permit (principal, action,")  # Cedar that does not parse
        refused = await gateway.reload(identity=OPERATOR, cause="the console")
        assert not refused.applied and "rules.cedar" in refused.error
        assert set(gateway.upstreams) == {"a", "b"}  # the running configuration stays

        # Two asked at once: one after the other, never interleaved; the second finds nothing left to do.
        (tmp_path / "rules.cedar").write_text('@id("all")\npermit (principal, action, resource);\n')
        write(config, ("a",))
        first, second = await asyncio.gather(gateway.reload(), gateway.reload())
        assert first.removed == ("b",) and second.applied and second.removed == ()
    finally:
        await gateway.close()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    reloads = [r for r in records if r["kind"] == "call" and r["what"]["method"] == "admin/reload"]
    assert [(r["who"]["name"], r["outcome"]) for r in reloads] == [
        ("ops-alice", 0), ("ops-alice", 1), ("local-process", 0), ("local-process", 0)]


async def test_the_demo_configuration_has_no_file_to_reload() -> None:
    gateway = build_gateway(default_config())
    try:
        outcome = await gateway.reload()
    finally:
        await gateway.close()
    assert not outcome.applied and "no file to read again" in outcome.error


async def test_a_client_file_with_comments_reloads_as_it_loads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = tmp_path / "mcp.json"  # a client's file, as Cursor writes it

    def entry(name: str) -> str:
        return json.dumps({"command": sys.executable, "args": [SERVER, name], "sandbox": "none"})

    config.write_text('{"mcpServers": {"a": %s}}' % entry("a"))
    gateway = build_gateway(load_config(config))
    gateway.start()
    try:
        await gateway.wait_ready(120)
        config.write_text('{\n  // added today\n  "mcpServers": {"a": %s, "b": %s,}\n}' % (entry("a"), entry("b")))
        outcome = await gateway.reload()
        assert outcome.applied and outcome.added == ("b",), outcome
        assert gateway.config.client_file
        config.write_text('{"mcpServers": {"a": {"command": 7}}}')
        refused = await gateway.reload()
        assert not refused.applied and str(config) in refused.error and "mcpServers.a.command" in refused.error
    finally:
        await gateway.close()


async def test_a_removed_server_finishes_the_call_it_is_answering_then_stops(tmp_path: Path) -> None:
    (tmp_path / "rules.cedar").write_text('@id("all")\npermit (principal, action, resource);\n')
    config = tmp_path / "bastion.json"
    write(config, ("a", "b"))
    gateway = build_gateway(load_config(config))
    gateway.start()
    try:
        await gateway.wait_ready(120)
        session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "test")
        leaving = gateway.upstreams["a"]
        hold = asyncio.ensure_future(asyncio.wait_for(gateway.handle(GatewayRequest(
            "tools/call", {"name": "a__hold", "arguments": {}}, session, gateway.catalog)), 120))
        while not leaving.busy():  # until the call is on its way to the server
            await asyncio.sleep(0)
        write(config, ("b",))
        outcome = await gateway.reload()
        assert outcome.removed == ("a",) and gateway.catalog.tool("a__hello") is None
        assert not hold.done() and leaving.pid is not None  # still answering it
        # Only the test can still reach it (the catalog no longer can): let its call answer, on the same (handshake-era)
        # connection.
        await leaving.request("tools/call", {"name": "release", "arguments": {}}, client_era="legacy")
        assert (await hold)["content"][0]["text"] == "held by a"
        await asyncio.gather(*gateway._retiring)  # then it stops
        assert leaving.pid is None
    finally:
        await gateway.close()


async def test_a_reloaded_chain_is_still_metered_and_its_policy_still_counted(tmp_path: Path) -> None:
    """The metrics' meter and clock and the policy's decision counts survive a reload: the new policy's rule is
    counted under its own name, and calls after the reload are counted as before."""
    (tmp_path / "rules.cedar").write_text('@id("first")\npermit (principal, action, resource);\n')
    config = tmp_path / "bastion.json"
    write(config, ("a",))
    gateway = build_gateway(load_config(config))
    gateway.start()
    session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "test")

    async def call() -> None:
        result = await gateway.handle(GatewayRequest("tools/call", {"name": "a__hello", "arguments": {}}, session,
                                                     gateway.catalog))
        assert result["content"][0]["text"] == "hello from a"

    try:
        await gateway.wait_ready(120)
        await call()
        (tmp_path / "rules.cedar").write_text('@id("second")\npermit (principal, action, resource);\n')
        assert (await gateway.reload()).applied
        await call()
        await call()
    finally:
        await gateway.close()
    metrics = gateway.metrics
    rules = {key[2]: count for key, count in metrics.decisions.items() if key[0] == "authorization"}
    assert rules.get("first") == 1 and rules.get("second") == 2, metrics.decisions
    calls = sum(count for labels, count in metrics.requests.items() if labels[0] == "tools/call" and labels[3] == "ok")
    assert calls == 3
    assert metrics.totals().server_latency.count == 3  # the clock, innermost, is on the new chain too


async def test_a_reload_keeps_the_rate_limits_buckets_unless_the_limits_changed(tmp_path: Path) -> None:
    """Editing another key refills no bucket: a caller over its limit stays over it after the reload; a reload
    that changes the limits starts them afresh."""
    (tmp_path / "rules.cedar").write_text('@id("all")\npermit (principal, action, resource);\n')
    config = tmp_path / "bastion.json"

    def limited(per_minute: int, **settings) -> None:
        write(config, ("a",), **settings)
        body = json.loads(config.read_text())
        body["policy"]["rate_limits"] = [{"scope": "tool", "match": "a/hello", "rate": 0.001,
                                          "burst": per_minute}]
        config.write_text(json.dumps(body))

    limited(2)
    gateway = build_gateway(load_config(config))
    gateway.start()
    session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "test")

    async def call() -> str:
        try:
            result = await gateway.handle(GatewayRequest("tools/call", {"name": "a__hello", "arguments": {}},
                                                         session, gateway.catalog))
        except GatewayError as error:
            return error.message
        return result["content"][0]["text"]

    try:
        await gateway.wait_ready(120)
        assert [await call(), await call()] == ["hello from a"] * 2
        assert "Rate limit exceeded" in await call()
        limited(2, page_size=7)  # another key: the bucket is kept, still empty
        assert (await gateway.reload()).applied and gateway.config.page_size == 7
        assert "Rate limit exceeded" in await call()
        limited(5)  # the limit itself: a bucket of its own, full
        assert (await gateway.reload()).applied
        assert await call() == "hello from a"
    finally:
        await gateway.close()
