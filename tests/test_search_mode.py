"""Search mode and the host API, end to end through the gateway with policy in the way."""

from __future__ import annotations

import json

import pytest

from bastion.host import Host
from tests.support import READY_TIMEOUT, RawClient, VENV_BIN, raw_server

HIDE_CRASH = """
@id("list") permit (principal, action == Bastion::Action::"list_tools", resource);
@id("call") permit (principal, action == Bastion::Action::"call_tool", resource);
@id("hide-crash") forbid (principal, action == Bastion::Action::"call_tool", resource) when { resource.name == "crash" };
"""


def _config(tmp_path, exposure="search"):
    (tmp_path / "p.cedar").write_text(HIDE_CRASH)
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server(), "time": {"command": str(VENV_BIN / "mcp-server-time")}},
        "tools": {"exposure": exposure, "always_list": ["raw__echo"]},
        "policy": {"policy_files": ["p.cedar"], "audit": {"enabled": False}},
        "ready_timeout": READY_TIMEOUT,
    }))
    return config


def _texts(result):
    return json.loads(result["content"][0]["text"])["tools"]


def test_search_mode_lists_meta_tools_finds_and_calls(tmp_path):
    client = RawClient(_config(tmp_path))
    try:
        client.initialize()
        listed = {t["name"] for t in client.request(1, "tools/list", {})["result"]["tools"]}
        assert listed == {"search_tools", "call_tool", "raw__echo"}

        found = client.request(2, "tools/call", {"name": "search_tools", "arguments": {
            "query": "convert a time from one timezone to another", "k": 3}})["result"]
        names = [t["name"] for t in _texts(found)]
        assert names[0] == "time__convert_time"
        assert all("inputSchema" in t for t in _texts(found))

        # The found tools join this client's list, and the client is told.
        assert any(m.get("method") == "notifications/tools/list_changed" for m in client.skipped)
        relisted = {t["name"] for t in client.request(3, "tools/list", {})["result"]["tools"]}
        assert set(names) <= relisted

        crash = client.request(4, "tools/call", {"name": "search_tools", "arguments": {"query": "crash exit the process", "k": 20}})
        assert "raw__crash" not in [t["name"] for t in _texts(crash["result"])]  # hidden by policy, never found

        via_meta = client.request(5, "tools/call", {"name": "call_tool", "arguments": {
            "name": "raw__echo", "arguments": {"text": "via call_tool"}}})
        assert via_meta["result"]["content"][0]["text"] == "via call_tool"
        hidden = client.request(6, "tools/call", {"name": "call_tool", "arguments": {"name": "raw__crash"}})
        assert hidden["result"]["isError"] and "unknown tool" in hidden["result"]["content"][0]["text"]
    finally:
        client.close()


@pytest.mark.parametrize("exposure", ["all", "search"])
async def test_host_api_finds_and_calls_tools_whatever_the_exposure_mode(tmp_path, exposure):
    async with await Host.open(_config(tmp_path, exposure=exposure)) as host:
        listed = {t["name"] for t in await host.list_tools()}
        assert {"raw__echo", "time__get_current_time"} <= listed and "search_tools" not in listed
        assert "raw__crash" not in listed  # hidden by policy
        tools = await host.find_tools("get the current time now", k=2)
        assert "time__get_current_time" in [t["name"] for t in tools]
        assert all("inputSchema" in t for t in tools)
        assert all(t["name"] != "raw__crash" for t in await host.find_tools("crash the process", k=10))
        result = await host.call_tool("raw__echo", {"text": "from the host"})
        assert result["content"][0]["text"] == "from the host"


async def test_the_configured_embedding_budget_reaches_the_index(tmp_path):
    config = _config(tmp_path)
    data = json.loads(config.read_text())
    data["tools"]["embedding_tokens"] = 32
    config.write_text(json.dumps(data))
    async with await Host.open(config) as host:
        tools = await host.find_tools("convert a time from one timezone to another", k=1)
        assert [t["name"] for t in tools] == ["time__convert_time"]
        index = await host._gateway.tool_index().current()
        assert index.doc_max_tokens == 32


def test_an_always_listed_name_no_server_offers_is_reported_once(tmp_path):
    config = _config(tmp_path)
    data = json.loads(config.read_text())
    data["tools"]["always_list"] = ["raw__echo", "echo"]  # the second lacks its server's prefix
    config.write_text(json.dumps(data))
    client = RawClient(config)
    try:
        client.initialize()
        for request_id in (1, 2):
            listed = {t["name"] for t in client.request(request_id, "tools/list", {})["result"]["tools"]}
            assert listed == {"search_tools", "call_tool", "raw__echo"}
    finally:
        _, stderr = client.close()
    reports = [line for line in stderr.splitlines() if "tools.always_list names" in line]
    assert len(reports) == 1 and "'echo'" in reports[0], stderr


def _listed_bytes(tmp_path, name, extra_tools):
    config = tmp_path / f"{name}.json"
    # Each gateway its own pins: the two run different command lines under the same server names, which one pins
    # file would rightly take for a changed entry (configuration drift) and withhold.
    config.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT,
                                  "guardrails": {"pins": {"path": str(tmp_path / f"{name}-pins.json")}}, "servers": {
        "b": raw_server(tag=f"{name}-b", env={"RAW_SERVER_EXTRA_TOOLS": json.dumps(extra_tools)}),
        "a": raw_server(tag=f"{name}-a")}}))
    client = RawClient(config)
    try:
        client.initialize()
        client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        while True:
            line = client.recv_line()
            if json.loads(line).get("id") == 1:
                return line
    finally:
        client.close()


def test_tools_list_is_the_same_bytes_whatever_key_order_a_server_writes(tmp_path):
    """Deterministic lists for prompt caches, end to end: two gateways whose servers write keys in other orders."""
    written = {"name": "lookup", "description": "Look a word up", "inputSchema": {
        "type": "object", "properties": {"word": {"type": "string"}, "lang": {"type": "string"}}}}
    reversed_keys = {"inputSchema": {"properties": {"lang": {"type": "string"}, "word": {"type": "string"}},
                                     "type": "object"}, "description": "Look a word up", "name": "lookup"}
    first = _listed_bytes(tmp_path, "first", [written])
    second = _listed_bytes(tmp_path, "second", [reversed_keys])
    assert first == second
    assert b'"b__lookup"' in first and first.index(b'"a__big"') < first.index(b'"b__lookup"')
