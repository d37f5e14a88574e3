"""A guardrail's intervention names the caller whose request it was, in its log line and audit record, by name,
method and issuer, never with the token; the scanning guardrail in a real chain is one such."""

from __future__ import annotations

import logging

from bastion.gateway.pipeline import build_pipeline
from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.guardrails.scanning import build
from bastion.model import GatewayRequest, Identity, Session, ToolEntry

TOKEN = "eyJhbGciOiJSUzI1NiJ9.dG9rZW4tcGF5bG9hZA.c2ln"
ALICE = Identity("alice", ("dev",), "oauth", "https://id.example.com", frozenset({"mcp:tools"}),
                 {"tenant": "acme-claim-value"}, subject_token=TOKEN)
KEY = "AKIAQ3EGRV7HZ2K4MPXN"


class _Catalog:
    _tools = [ToolEntry("ops__env", "ops", "env", {"name": "ops__env"})]

    def tool(self, name):
        return next((entry for entry in self._tools if entry.exposed_name == name), None)

    def tools(self):
        return self._tools


def test_the_record_and_the_line_name_the_caller_and_never_its_token(caplog) -> None:
    records: list[dict] = []
    with caplog.at_level(logging.WARNING, logger="bastion.guardrails"):
        InterventionLog(records.append).report(Intervention("taint", "refused", "web", "tools/call web__post",
                                                            "tainted", "taint", "a detail", "s1", ALICE))
    assert records[0]["who"] == {"name": "alice", "groups": ["dev"], "authenticated_by": "oauth",
                                 "issuer": "https://id.example.com"}
    assert "identity" not in records[0] and records[0]["session"] == "s1" and records[0]["found"] == "tainted"
    assert TOKEN not in str(records) and "acme-claim-value" not in str(records)
    assert "for alice (oauth, https://id.example.com)" in caplog.text and TOKEN not in caplog.text


def test_an_intervention_of_no_request_has_no_caller() -> None:
    records: list[dict] = []
    InterventionLog(records.append).report(Intervention("pinning", "withheld", "fs", "tool read", "changed", "tofu"))
    assert "who" not in records[0]


async def test_a_redaction_in_a_real_chain_names_who_called() -> None:
    records: list[dict] = []
    interceptor = build(GuardrailsConfig(), InterventionLog(records.append), _Catalog())

    async def terminal(request):
        return {"content": [{"type": "text", "text": f"key {KEY}"}], "isError": False}

    handle = build_pipeline([interceptor], terminal)
    session = Session(ALICE, "modern", "2026-07-28", {}, session_id="s2")
    result = await handle(GatewayRequest("tools/call", {"name": "ops__env", "arguments": {}}, session, _Catalog()))
    assert KEY not in str(result)
    assert [(r["guardrail"], r["who"]["name"], r["who"]["issuer"]) for r in records] == [
        ("secrets", "alice", "https://id.example.com")]
    assert TOKEN not in str(records)
