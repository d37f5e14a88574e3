"""Every decision names the caller the same way (name, method, issuer), never its token: audit records, approval
prompts and queue records, refusal log lines; and what Bastion keeps per caller (rate-limit buckets, approvals
granted) is kept apart for two callers, even two of one name from different issuers.

Driven through the real gateway in front of ``tests/fixtures/raw_server.py``, as tests/policy/test_pipeline.py."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

from bastion.gateway.pipeline import build_pipeline, deliver
from bastion.model import TO_CLIENT, GatewayRequest, Identity
from bastion.model import Session
from tests.policy import test_pipeline
from tests.policy.test_pipeline import ACCEPT, Person, call, gateway_factory, policy_config, refusal

__all__ = ["gateway_factory"]  # the fixture, used by name

TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXBheWxvYWQ.c2lnbmF0dXJl"
ALICE = Identity("alice", ("dev",), "oauth", "https://id.example.com", frozenset({"mcp:tools"}), {"tenant": "acme"},
                 subject_token=TOKEN)
ALICE_ELSEWHERE = Identity("alice", ("dev",), "oauth", "https://other.example.com", subject_token=TOKEN)
BOB = Identity("bob", ("dev",), "api_key")
MALLORY = Identity("mallory", ())


def session(who: Identity, **options) -> Session:
    """A session of its own for each caller (calls of two sessions at once must not share a session id)."""
    made = test_pipeline.session(who, **options)
    made.session_id = f"s-{who.name}-{who.issuer}-{id(made)}"
    return made


async def answered(_: GatewayRequest) -> dict:
    return {"ok": True}


def _records(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


async def test_audit_records_name_each_caller_with_method_and_issuer_and_never_the_token(tmp_path: Path,
                                                                                           gateway_factory) -> None:
    gateway, runtime = await gateway_factory(policy_config(tmp_path))
    await asyncio.gather(call(gateway, session(ALICE), "raw__echo", {"text": "a"}),
                         call(gateway, session(BOB), "raw__echo", {"text": "b"}))
    await refusal(call(gateway, session(MALLORY), "raw__echo", {"text": "m"}))
    # A server's request to alice's client passes the policy's hook for requests, audited as a call is.
    asked_for = GatewayRequest("sampling/createMessage", {"messages": []}, session(ALICE), gateway.catalog,
                               server="raw", direction=TO_CLIENT, deliver=answered)
    await refusal(build_pipeline(runtime.interceptors, deliver)(asked_for))  # this policy permits no server requests
    await runtime.aclose()
    records = _records(tmp_path)
    calls = {r["who"]["name"]: r for r in records if r["kind"] == "call"}
    assert calls["alice"]["who"] | {"session": ""} == {"name": "alice", "groups": ["dev"], "authenticated_by": "oauth",
                                                       "issuer": "https://id.example.com", "session": ""}
    assert calls["bob"]["who"]["authenticated_by"] == "api_key" and "issuer" not in calls["bob"]["who"]
    assert calls["mallory"]["outcome"] == -32001 and calls["mallory"]["who"]["authenticated_by"] == "configured"
    asked = [r for r in records if r["kind"] == "decision" and r["what"].get("method") == "sampling/createMessage"]
    assert asked[0]["who"]["issuer"] == "https://id.example.com"
    text = (tmp_path / "audit.jsonl").read_text()
    assert TOKEN not in text and "c2VjcmV0LXBheWxvYWQ" not in text
    assert "acme" not in text  # claims are the policy's, not the trail's


async def test_refusals_are_logged_with_the_caller(tmp_path: Path, gateway_factory, caplog) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    with caplog.at_level(logging.INFO, logger="bastion.policy"):
        await refusal(call(gateway, session(MALLORY), "raw__echo", {"text": "top secret argument"}))
        await refusal(call(gateway, session(ALICE), "raw__crash", {}))
        await call(gateway, session(BOB), "raw__echo", {"text": "fine"})
    lines = [r.getMessage() for r in caplog.records if r.name == "bastion.policy"]
    assert any("raw__echo for mallory (configured)" in line and "default-deny" in line for line in lines), lines
    assert any("raw__crash for alice (oauth, https://id.example.com)" in line and "no-crash" in line for line in lines)
    assert not any("bob" in line for line in lines)  # allowed calls are the audit trail's, not refusal lines
    assert not any("top secret argument" in line or TOKEN in line for line in caplog.text.splitlines())


async def test_rate_limits_are_per_caller_and_one_name_from_two_issuers_is_two_callers(tmp_path: Path,
                                                                                         gateway_factory) -> None:
    now = [100.0]
    config = policy_config(tmp_path, rate_limits=[{"scope": "principal", "rate": 0.1, "burst": 1}])
    gateway, _ = await gateway_factory(config, clock=lambda: now[0])
    for who in (ALICE, ALICE_ELSEWHERE, BOB):
        assert (await call(gateway, session(who), "raw__echo", {"text": who.name}))["content"][0]["text"] == who.name
    for who in (ALICE, ALICE_ELSEWHERE, BOB):
        error = await refusal(call(gateway, session(who), "raw__echo", {"text": "again"}))
        assert error.code == -32000 and error.data["retryAfterSeconds"] == 10
    now[0] += 10
    assert (await call(gateway, session(BOB), "raw__echo", {"text": "later"}))["content"][0]["text"] == "later"


async def test_a_named_limit_still_matches_a_token_caller_by_name(tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, rate_limits=[{"scope": "principal", "match": "alice", "rate": 0.01, "burst": 1}])
    gateway, _ = await gateway_factory(config, clock=lambda: 5.0)
    await call(gateway, session(ALICE), "raw__echo", {"text": "1"})
    assert (await refusal(call(gateway, session(ALICE), "raw__echo", {"text": "2"}))).code == -32000
    for _ in range(3):  # bob is not named by the limit
        await call(gateway, session(BOB), "raw__echo", {"text": "b"})


async def test_the_approval_prompt_says_who_asks(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    person = Person(ACCEPT)
    await call(gateway, session(ALICE, client=person), "raw__big", {"size": 3})
    message = person.asked[0]["message"]
    assert message.startswith("alice (oauth, https://id.example.com) asks: Allow the tool 'big'")
    assert TOKEN not in json.dumps(person.asked)


async def test_the_approval_queue_record_names_the_caller(tmp_path: Path, gateway_factory, caplog) -> None:
    config = policy_config(tmp_path, approval={"fallback": "queue", "timeout_seconds": 0.3,
                                               "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05})
    gateway, _ = await gateway_factory(config)
    with caplog.at_level(logging.INFO, logger="bastion.approval"):
        await refusal(call(gateway, session(ALICE), "raw__big", {"size": 2}))
    records = [json.loads(p.read_text()) for p in (tmp_path / "queue").glob("*.json")]
    assert records[0]["identity"] == "alice"
    assert records[0]["who"] == {"name": "alice", "groups": ["dev"], "authenticated_by": "oauth",
                                 "issuer": "https://id.example.com"}
    assert TOKEN not in json.dumps(records)
    assert "called by alice (oauth, https://id.example.com)" in caplog.text
    assert "not approved for alice (oauth, https://id.example.com)" in caplog.text


async def test_an_approval_granted_to_one_issuers_alice_is_not_another_issuers(tmp_path: Path,
                                                                               gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    asks = session(ALICE, era="modern", caps={"elicitation": {}})
    first = await call(gateway, asks, "raw__big", {"size": 4})
    state = first["requestState"]
    assert first["inputRequests"]["approval"]["params"]["message"].startswith("alice (oauth, https://id.example.com)")
    impostor = session(ALICE_ELSEWHERE, era="modern", caps={"elicitation": {}})
    error = await refusal(call(gateway, impostor, "raw__big", {"size": 4}, requestState=state,
                               inputResponses={"approval": ACCEPT}))
    assert "different call" in error.data["reason"]
    done = await call(gateway, asks, "raw__big", {"size": 4}, requestState=state, inputResponses={"approval": ACCEPT})
    assert done["content"][0]["text"] == "xxxx"


async def test_lists_are_filtered_per_caller_in_both_eras(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    for era in ("legacy", "modern"):
        seen = {}
        for who in (ALICE, MALLORY):
            listed = await gateway.handle(GatewayRequest("tools/list", {}, session(who, era=era), gateway.catalog))
            seen[who.name] = sorted(t["name"] for t in listed["tools"])
        assert seen == {"alice": ["raw__big", "raw__echo"], "mallory": []}, era


async def test_bastion_approvals_shows_who_asks(tmp_path: Path, gateway_factory) -> None:
    queue = tmp_path / "queue"
    config = policy_config(tmp_path, approval={"fallback": "queue", "timeout_seconds": 60, "queue_dir": str(queue),
                                               "poll_seconds": 0.05})
    gateway, _ = await gateway_factory(config)
    waiting = asyncio.create_task(call(gateway, session(ALICE), "raw__big", {"size": 2}))
    for _ in range(600):
        if list(queue.glob("*.json")):
            break
        await asyncio.sleep(0.05)

    def approvals(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bastion", "approvals", "--queue-dir", str(queue), *extra],
                              capture_output=True, text=True, timeout=120)

    listed = await asyncio.to_thread(approvals, "--json")
    [entry] = json.loads(listed.stdout)
    assert entry["who"] == {"name": "alice", "groups": ["dev"], "authenticated_by": "oauth",
                            "issuer": "https://id.example.com"}
    table = await asyncio.to_thread(approvals)
    assert "alice (oauth, https://id.example.com)" in table.stdout
    assert TOKEN not in listed.stdout + table.stdout
    await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "bastion", "deny", entry["id"], "--queue-dir",
                                             str(queue)], capture_output=True, timeout=120)
    assert (await refusal(waiting)).code == -32001
