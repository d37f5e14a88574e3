"""The scanning interceptor in the chain, in process: what it does with each method's answer, its errors and a
server's sampling request, which server's settings apply (also when the call's name is still the client's bytes),
what it reports, and that a result scanned in a worker thread comes out the same."""

from __future__ import annotations

import copy

import msgspec
import pytest

from bastion.gateway.pipeline import build_pipeline
from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.report import InterventionLog
from bastion.guardrails.scanning import BLOCKED, ScannerInBackground, ScanningInterceptor, ScanningPolicy, build
from bastion.model import GatewayError, GatewayRequest, Identity, Session, ToolEntry

KEY = "AKIAQ3EGRV7HZ2K4MPXN"
EMAIL = "jane.roe@acme-mail.io"


class _Catalog:
    def __init__(self) -> None:
        self._tools = [ToolEntry("crm__lookup", "crm", "lookup", {"name": "crm__lookup"}),
                       ToolEntry("ops__env", "ops", "env", {"name": "ops__env"})]

    def tool(self, name):
        return next((entry for entry in self._tools if entry.exposed_name == name), None)

    def tools(self):
        return self._tools

    def resource_owner(self, uri):
        return "ops" if uri.startswith("ops://") else None


def _request(method, params, server=None):
    session = Session(Identity("tester"), "legacy", "2025-11-25", {}, session_id="s1")
    return GatewayRequest(method, params, session, _Catalog(), server=server)


def _chain(answer, config=None, log=None):
    records = []
    log = log or InterventionLog(records.append)
    interceptor = build(config or GuardrailsConfig(), log, _Catalog())

    async def terminal(request):
        if isinstance(answer, Exception):
            raise answer
        return copy.deepcopy(answer)

    return build_pipeline([interceptor], terminal), records, interceptor


def _text(content):
    return {"content": [{"type": "text", "text": content}], "isError": False}


async def test_a_call_result_is_redacted_and_reported_without_the_value():
    handle, records, _ = _chain(_text(f"key {KEY}, owner {EMAIL}"))
    result = await handle(_request("tools/call", {"name": "ops__env", "arguments": {}}))
    assert result == _text("key [redacted: aws-access-key], owner [redacted: email]")
    assert [(r["guardrail"], r["action"], r["found"], r["server"], r["target"]) for r in records] == [
        ("secrets", "redacted", "aws-access-key", "ops", "tools/call ops__env"),
        ("pii", "redacted", "email", "ops", "tools/call ops__env")]
    assert all(KEY not in str(r) and EMAIL not in str(r) for r in records)
    assert records[0]["detail"] == "1 value in content[0].text" and records[0]["session"] == "s1"


async def test_the_servers_own_settings_apply_also_to_a_name_left_as_bytes():
    config = GuardrailsConfig.model_validate({"servers": {"crm": {"pii": "off"}}})
    handle, _, interceptor = _chain(_text(f"owner {EMAIL}"), config)
    assert interceptor.reads_params is False
    raw_name = msgspec.Raw(b'"crm__lookup"')
    assert await handle(_request("tools/call", {"name": raw_name, "arguments": msgspec.Raw(b"{}")})) == _text(
        f"owner {EMAIL}")
    assert await handle(_request("tools/call", {"name": "ops__env"})) == _text("owner [redacted: email]")


async def test_blocking_a_call_answers_an_error_result_that_says_why():
    config = GuardrailsConfig.model_validate({"scanning": {"kinds": {"aws-access-key": "block"}}})
    handle, records, _ = _chain(_text(f"key {KEY}"), config)
    result = await handle(_request("tools/call", {"name": "ops__env"}))
    assert result["isError"] is True and KEY not in str(result)
    assert "aws-access-key" in result["content"][0]["text"] and "server 'ops'" in result["content"][0]["text"]
    assert records[0]["action"] == "blocked"


async def test_blocking_a_resource_refuses_it_with_a_json_rpc_error():
    config = GuardrailsConfig.model_validate({"scanning": {"servers": {"ops": {"email": "block"}}}})
    handle, _, _ = _chain({"contents": [{"uri": "ops://team", "text": f"lead: {EMAIL}"}]}, config)
    with pytest.raises(GatewayError) as refused:
        await handle(_request("resources/read", {"uri": "ops://team"}))
    assert refused.value.code == BLOCKED and "email" in refused.value.message
    assert EMAIL not in str(refused.value.to_error())


async def test_a_servers_error_message_and_data_are_redacted():
    handle, records, _ = _chain(GatewayError(-32000, f"bad key {KEY}", {"hint": f"ask {EMAIL}"}))
    with pytest.raises(GatewayError) as raised:
        await handle(_request("tools/call", {"name": "ops__env"}))
    assert raised.value.code == -32000
    assert raised.value.to_error() == {"code": -32000, "message": "bad key [redacted: aws-access-key]",
                                       "data": {"hint": "ask [redacted: email]"}}
    assert {r["found"] for r in records} == {"aws-access-key", "email"}


async def test_a_sampling_request_is_redacted_before_the_client_sees_it_or_refused():
    seen = []
    interceptor = build(GuardrailsConfig(), InterventionLog(), _Catalog())

    async def client(request):
        seen.append(copy.deepcopy(request.params))
        return {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}

    handle = build_pipeline([interceptor], client)
    def params():
        return {"messages": [{"role": "user", "content": {"type": "text", "text": f"use {KEY}"}}], "maxTokens": 5}

    assert (await handle(_request("sampling/createMessage", params(), server="ops")))["model"] == "m"
    assert seen[0]["messages"][0]["content"]["text"] == "use [redacted: aws-access-key]"

    blocking = build(GuardrailsConfig.model_validate({"scanning": {"kinds": {"aws-access-key": "block"}}}),
                     InterventionLog(), _Catalog())
    with pytest.raises(GatewayError) as refused:
        await build_pipeline([blocking], client)(_request("sampling/createMessage", params(), "ops"))
    assert refused.value.code == BLOCKED and "sampling request" in refused.value.message
    assert len(seen) == 1  # the refused request never reached the client


async def test_a_large_result_scanned_in_a_thread_comes_out_as_inline():
    text = ("ordinary line of a log\n" * 5000) + f"AWS_ACCESS_KEY_ID={KEY}\n" + ("more\n" * 100)
    inline, _, _ = _chain(_text(text), GuardrailsConfig.model_validate({"scanning": {"thread_above_bytes": 10**9}}))
    threaded, _, _ = _chain(_text(text), GuardrailsConfig.model_validate({"scanning": {"thread_above_bytes": 0}}))
    request = {"name": "ops__env"}
    expected = await inline(_request("tools/call", dict(request)))
    assert KEY not in str(expected)
    assert await threaded(_request("tools/call", dict(request))) == expected


def test_off_everywhere_builds_nothing():
    config = GuardrailsConfig.model_validate({"secrets": "off", "pii": "off"})
    assert build(config, InterventionLog(), _Catalog()) is None
    one_kind = GuardrailsConfig.model_validate({"secrets": "off", "pii": "off", "scanning": {"kinds": {"email": "redact"}}})
    assert build(one_kind, InterventionLog(), _Catalog()) is not None


async def test_a_scanner_that_cannot_start_withholds_answers_with_the_reason_instead_of_passing_them():
    def broken():
        raise RuntimeError("no Hyperscan for this CPU")

    config = GuardrailsConfig()
    interceptor = ScanningInterceptor(ScannerInBackground(broken), ScanningPolicy(config), InterventionLog(), 65536)

    async def terminal(request):
        return _text(f"key {KEY}")

    with pytest.raises(GatewayError) as refused:
        await build_pipeline([interceptor], terminal)(_request("tools/call", {"name": "ops__env"}))
    assert "no Hyperscan for this CPU" in refused.value.message and "withheld" in refused.value.message
