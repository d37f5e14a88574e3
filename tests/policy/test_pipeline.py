"""The policy interceptors driven through ``build_pipeline`` in front of the real gateway and a real server.

The terminal handler is Bastion's gateway core routing to ``tests/fixtures/raw_server.py`` over stdio. The
person who approves calls is played by a ``ClientChannel`` that answers elicitation requests.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.gateway.core import Gateway
from bastion.gateway.pipeline import build_pipeline, deliver
from bastion.protocol.jsonrpc import RawResponse
from bastion.model import TO_CLIENT, GatewayError, GatewayRequest, Identity, Session
from bastion.policy.audit import verify
from bastion.policy.config import PolicyConfig
from bastion.policy.interceptors import build_policy_runtime

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ALICE = Identity("alice", ("dev",))
MALLORY = Identity("mallory", ())

POLICY = '''
@id("devs-echo")
permit (principal in Bastion::Group::"dev", action == Bastion::Action::"call_tool", resource)
when { resource.name == "echo" || resource.name == "crash" };

@id("big-needs-approval")
@approval("required")
permit (principal in Bastion::Group::"dev", action == Bastion::Action::"call_tool", resource)
when { resource.name == "big" };

@id("no-crash")
forbid (principal, action == Bastion::Action::"call_tool", resource) when { resource.name == "crash" };

@id("lists")
permit (principal, action == Bastion::Action::"list_tools", resource);
'''


class Person:
    """A client channel whose user answers approval prompts (or never does)."""

    def __init__(self, answer: Mapping[str, Any] | None, elicitation: bool = True) -> None:
        self.answer = answer
        self.elicitation = elicitation
        self.asked: list[Mapping[str, Any]] = []
        self.told: list[tuple[str, Any]] = []

    def supports(self, capability: str) -> bool:
        return capability == "elicitation" and self.elicitation

    def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        self.told.append((method, params))

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        assert method == "elicitation/create"
        self.asked.append(params)
        if self.answer is None:
            await asyncio.sleep(3600)
        return dict(self.answer)


ACCEPT = {"action": "accept", "content": {"approve": True}}
DECLINE = {"action": "decline"}


def policy_config(tmp_path: Path, **overrides: Any) -> PolicyConfig:
    (tmp_path / "policy.cedar").write_text(POLICY)
    base: dict[str, Any] = {
        "policy_files": ["policy.cedar"],
        "base_dir": str(tmp_path),
        "audit": {"path": str(tmp_path / "audit.jsonl")},
        "guards": [{"kind": "shell", "tool": "raw/echo", "argument": "text", "mode": "command"}],
        "approval": {"timeout_seconds": 5, "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05},
    }
    base.update(overrides)
    return PolicyConfig.model_validate(base)


@pytest.fixture()
async def gateway_factory(tmp_path: Path):
    started: list[Any] = []

    async def make(config: PolicyConfig, **options: Any):
        runtime = build_policy_runtime(config, **options)
        servers = {"raw": ServerConfig(command=sys.executable, args=[str(FIXTURES / "raw_server.py")], trust="trusted")}
        # The policy under test comes in as interceptors; the configuration's own is off so it is not run twice.
        gateway = build_gateway(GatewayConfig(servers=servers, policy=None), interceptors=runtime.interceptors)
        gateway.start({"elicitation": {}})
        await gateway.wait_ready(20)
        started.append((gateway, runtime))
        return gateway, runtime

    yield make
    for gateway, runtime in started:
        await runtime.aclose()
        await gateway.close()


def session(identity: Identity = ALICE, era: str = "legacy", client: Any = None, caps: Any = None) -> Session:
    version = "2026-07-28" if era == "modern" else "2025-11-25"
    return Session(identity, era, version, caps or {}, {"name": "test"}, f"s-{id(client)}", client=client)


async def call(gateway: Gateway, who: Session, name: str, arguments: Mapping[str, Any], **extra: Any) -> Any:
    params = {"name": name, "arguments": dict(arguments), **extra}
    result = await gateway.handle(GatewayRequest("tools/call", params, who, gateway.catalog, request_id=1))
    # A client connection's result may pass as the server's bytes (the policy reads only its outcome).
    return result.decoded().result if type(result) is RawResponse else result


async def refusal(awaitable: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await awaitable
    return caught.value


async def test_lists_hide_what_the_principal_may_not_call(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    listed = await gateway.handle(GatewayRequest("tools/list", {}, session(), gateway.catalog))
    assert sorted(t["name"] for t in listed["tools"]) == ["raw__big", "raw__echo"]
    nothing = await gateway.handle(GatewayRequest("tools/list", {}, session(MALLORY), gateway.catalog))
    assert nothing["tools"] == []


async def test_allowed_call_reaches_the_server(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    result = await call(gateway, session(), "raw__echo", {"text": "git commit -m 'a; b | c'"})
    assert result["content"][0]["text"] == "git commit -m 'a; b | c'"


async def test_denied_call_never_reaches_the_server(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    error = await refusal(call(gateway, session(), "raw__crash", {}))
    assert error.code == -32001 and error.data == {"rule": "no-crash", "reason": "forbidden by policy"}
    error = await refusal(call(gateway, session(MALLORY), "raw__echo", {"text": "hi"}))
    assert error.data["rule"] == "default-deny"
    # The crash tool would have killed the server; it still answers.
    assert (await call(gateway, session(), "raw__echo", {"text": "alive"}))["content"][0]["text"] == "alive"


async def test_guard_and_schema_refusals(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    error = await refusal(call(gateway, session(), "raw__echo", {"text": "ls; cat /etc/passwd"}))
    assert error.code == -32602 and error.data["rule"] == "shell:raw/echo:text"
    assert "/etc/passwd" not in error.message
    # Arguments that do not fit the input schema are a tool execution error (SEP-1303): the model reads why.
    result = await call(gateway, session(), "raw__echo", {"text": 42})
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("Arguments refused by policy: argument /text fails the 'type' rule")


async def test_rate_limit_answers_32000_with_retry_after(tmp_path: Path, gateway_factory) -> None:
    now = [100.0]
    config = policy_config(tmp_path, rate_limits=[{"scope": "tool", "match": "raw/echo", "rate": 0.5, "burst": 2}])
    gateway, _ = await gateway_factory(config, clock=lambda: now[0])
    for _ in range(2):
        await call(gateway, session(), "raw__echo", {"text": "x"})
    error = await refusal(call(gateway, session(), "raw__echo", {"text": "x"}))
    assert error.code == -32000 and error.data["retryAfterSeconds"] == 2
    now[0] += 2
    assert (await call(gateway, session(), "raw__echo", {"text": "y"}))["content"][0]["text"] == "y"


async def test_legacy_approval_through_elicitation(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    person = Person(ACCEPT)
    result = await call(gateway, session(client=person), "raw__big", {"size": 5})
    assert result["content"][0]["text"] == "xxxxx"
    prompt = person.asked[0]
    assert "'big'" in prompt["message"] and "'raw'" in prompt["message"] and '"size": 5' in prompt["message"]
    assert prompt["requestedSchema"]["required"] == ["approve"]
    declined = await refusal(call(gateway, session(client=Person(DECLINE)), "raw__big", {"size": 5}))
    assert declined.code == -32001 and "declined" in declined.data["reason"]
    unticked = await refusal(call(gateway, session(client=Person({"action": "accept", "content": {"approve": False}})), "raw__big", {"size": 6}))
    assert unticked.code == -32001


async def test_approval_timeout_denies(tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, approval={"timeout_seconds": 0.3})
    gateway, _ = await gateway_factory(config)
    error = await refusal(call(gateway, session(client=Person(None)), "raw__big", {"size": 1}))
    assert "timed out" in error.data["reason"] and "timed out" in error.message


async def test_approval_remembered_per_session(tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, approval={"remember": "session", "timeout_seconds": 5})
    gateway, _ = await gateway_factory(config)
    person = Person(ACCEPT)
    who = session(client=person)
    for size in (1, 2, 3):
        await call(gateway, who, "raw__big", {"size": size})
    assert len(person.asked) == 1
    other = Person(ACCEPT)
    await call(gateway, session(client=other), "raw__big", {"size": 1})
    assert len(other.asked) == 1  # another session asks again


async def test_client_that_cannot_ask_gets_a_clear_refusal(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    error = await refusal(call(gateway, session(client=Person(ACCEPT, elicitation=False)), "raw__big", {"size": 1}))
    assert error.code == -32001 and "cannot ask" in error.message


async def test_modern_input_required_round_trip(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    who = session(era="modern", caps={"elicitation": {}})
    first = await call(gateway, who, "raw__big", {"size": 4})
    assert first["resultType"] == "input_required"
    ask = first["inputRequests"]["approval"]
    assert ask["method"] == "elicitation/create" and ask["params"]["mode"] == "form"
    state = first["requestState"]

    forged = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
    error = await refusal(call(gateway, who, "raw__big", {"size": 4}, requestState=forged,
                               inputResponses={"approval": ACCEPT}))
    assert "forged" in error.data["reason"]
    error = await refusal(call(gateway, who, "raw__big", {"size": 400}, requestState=state,
                               inputResponses={"approval": ACCEPT}))
    assert "different call" in error.data["reason"]
    error = await refusal(call(gateway, session(Identity("eve", ("dev",)), era="modern"), "raw__big", {"size": 4},
                               requestState=state, inputResponses={"approval": ACCEPT}))
    assert "different call" in error.data["reason"]

    result = await call(gateway, who, "raw__big", {"size": 4}, requestState=state, inputResponses={"approval": ACCEPT})
    assert result["content"][0]["text"] == "xxxx"

    second = await call(gateway, who, "raw__big", {"size": 9})
    declined = await refusal(call(gateway, who, "raw__big", {"size": 9}, requestState=second["requestState"],
                                  inputResponses={"approval": DECLINE}))
    assert "declined" in declined.data["reason"]


async def test_local_approval_queue_settled_from_the_command_line(tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, approval={"fallback": "queue", "timeout_seconds": 20,
                                               "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05})
    gateway, _ = await gateway_factory(config)
    queue_dir = str(tmp_path / "queue")

    async def settle(verb: str) -> str:
        for _ in range(60):
            listing = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "bastion", "approvals", "--queue-dir", queue_dir],
                capture_output=True, text=True)
            if "raw/big" in listing.stdout:
                approval_id = listing.stdout.splitlines()[1].split()[0]
                done = await asyncio.to_thread(
                    subprocess.run, [sys.executable, "-m", "bastion", verb, approval_id, "--queue-dir", queue_dir],
                    capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
                return approval_id
            await asyncio.sleep(0.05)
        raise AssertionError("the call never appeared in the queue")

    approved_call = asyncio.create_task(call(gateway, session(), "raw__big", {"size": 3}))
    approval_id = await settle("approve")
    assert (await approved_call)["content"][0]["text"] == "xxx"
    again = subprocess.run([sys.executable, "-m", "bastion", "deny", approval_id, "--queue-dir", queue_dir],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "already approved" in again.stderr

    denied_call = asyncio.create_task(call(gateway, session(), "raw__big", {"size": 2}))
    await settle("deny")
    error = await refusal(denied_call)
    assert error.code == -32001


async def test_queue_timeout_denies_and_expires(tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, approval={"fallback": "queue", "timeout_seconds": 0.3,
                                               "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05})
    gateway, _ = await gateway_factory(config)
    error = await refusal(call(gateway, session(), "raw__big", {"size": 2}))
    assert "timed out" in error.data["reason"]
    records = [json.loads(p.read_text()) for p in (tmp_path / "queue").glob("*.json")]
    assert [r["status"] for r in records] == ["expired"]


async def test_audit_trail_records_decisions_and_calls(tmp_path: Path, gateway_factory) -> None:
    gateway, runtime = await gateway_factory(policy_config(tmp_path))
    await call(gateway, session(), "raw__echo", {"text": "very secret text"})
    await refusal(call(gateway, session(), "raw__crash", {}))
    await runtime.aclose()
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    decisions = [r for r in lines if r["kind"] == "decision"]
    calls = [r for r in lines if r["kind"] == "call"]
    assert [d["decision"] for d in decisions] == ["allow", "deny"]
    assert decisions[1]["rule"] == "no-crash" and decisions[1]["who"]["name"] == "alice"
    assert calls[0]["outcome"] == "complete" and calls[1]["outcome"] == -32001
    assert calls[0]["what"]["arguments"] == {"text": {"string": 16}}
    assert "very secret text" not in (tmp_path / "audit.jsonl").read_text()
    assert all(isinstance(c["latency_ms"], float) for c in calls)
    assert verify([tmp_path / "audit.jsonl"]).ok


async def test_server_request_hook(tmp_path: Path, gateway_factory) -> None:
    _, runtime = await gateway_factory(policy_config(tmp_path, policy_files=[], include_default_policy=True))
    assert runtime.authorize_server_request(ALICE, "raw", "elicitation/create").allowed
    # Sampling is the sampling guardrail's to hold to budgets; the default policy lets every server ask.
    assert runtime.authorize_server_request(ALICE, "raw", "sampling/createMessage").allowed
    assert not runtime.authorize_server_request(ALICE, "raw", "tools/call").allowed


async def test_a_servers_request_bastion_answers_itself_is_not_authorized_and_its_ping_is_not_audited(
        tmp_path: Path, gateway_factory) -> None:
    gateway, runtime = await gateway_factory(policy_config(tmp_path))  # this policy permits no server request
    handle = build_pipeline(runtime.interceptors, deliver)
    reached: list[str] = []

    async def pong(_: GatewayRequest) -> dict[str, Any]:
        return {}

    async def not_found(asked: GatewayRequest) -> dict[str, Any]:
        raise GatewayError(-32601, f"Method not found: {asked.method}")

    async def client(asked: GatewayRequest) -> dict[str, Any]:
        reached.append(asked.method)
        return {}

    def asked(method: str, answer: Any, **marks: Any) -> GatewayRequest:
        return GatewayRequest(method, {}, session(), gateway.catalog, server="raw", direction=TO_CLIENT,
                              deliver=answer, **marks)

    assert await handle(asked("ping", pong, answered_by_bastion=True)) == {}
    assert (await refusal(handle(asked("x/unknown", not_found, answered_by_bastion=True)))).code == -32601
    # Unmarked, the same methods would be on their way to a client (a 2026-07-28 server's input_required may carry
    # any method): the policy refuses them as before, and no client is asked.
    assert (await refusal(handle(asked("ping", client)))).code == -32600
    assert (await refusal(handle(asked("x/unknown", client)))).code == -32600
    assert reached == []
    await runtime.aclose()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    recorded = [(r["kind"], r["what"]["method"], r.get("outcome", r.get("decision"))) for r in records if "what" in r]
    assert recorded == [("call", "x/unknown", -32601),
                        ("decision", "ping", "deny"), ("call", "ping", -32600),
                        ("decision", "x/unknown", "deny"), ("call", "x/unknown", -32600)]


async def test_approval_without_a_way_to_ask_is_refused_with_the_audit_off(tmp_path: Path) -> None:
    from bastion.gateway.pipeline import build_pipeline
    from bastion.model import ToolEntry

    runtime = build_policy_runtime(policy_config(tmp_path, audit={"enabled": False}))
    reached: list[str] = []

    async def route(request: GatewayRequest) -> dict[str, Any]:
        reached.append(request.method)
        return {"content": []}

    class OneTool:
        entry = ToolEntry("raw__big", "raw", "big", {"name": "raw__big"}, "trusted")

        def tool(self, name: str) -> ToolEntry | None:
            return self.entry if name == "raw__big" else None

        def tools(self) -> list[ToolEntry]:
            return [self.entry]

    full = build_pipeline(runtime.interceptors, route)
    error = await refusal(full(GatewayRequest("tools/call", {"name": "raw__big", "arguments": {}}, session(), OneTool())))
    assert "cannot ask" in error.message and reached == []


async def test_tools_approved_in_advance_skip_only_the_approval(tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, policy_files=["policy.cedar"], guards=[
        {"kind": "shell", "tool": "raw/big", "argument": "note", "mode": "argument"}])
    gateway, runtime = await gateway_factory(config, pre_approved={"raw": ["big", "crash"]})
    person = Person(ACCEPT)
    result = await call(gateway, session(client=person), "raw__big", {"size": 2})
    assert result["content"][0]["text"] == "xx" and person.asked == []  # nobody was asked
    # A forbid still forbids, and a guard still refuses, a tool the client approves in advance.
    assert (await refusal(call(gateway, session(client=person), "raw__crash", {}))).data["rule"] == "no-crash"
    guarded = await refusal(call(gateway, session(client=person), "raw__big", {"size": 1, "note": "a; rm -rf ~"}))
    assert guarded.code == -32602 and person.asked == []
    await runtime.aclose()
    decisions = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    approved = [d for d in decisions if d["kind"] == "decision" and d["rule"] == "approval:client-config"]
    assert len(approved) == 1 and "client's configuration" in approved[0]["reason"]


async def test_a_legacy_prompt_and_the_queue_race_the_first_answer_counts(tmp_path: Path, gateway_factory) -> None:
    from bastion.policy.approval import ApprovalQueue

    config = policy_config(tmp_path, approval={"fallback": "queue", "timeout_seconds": 20,
                                               "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05})
    gateway, _ = await gateway_factory(config)
    queue = ApprovalQueue(tmp_path / "queue")

    # The person never answers the client's prompt; `bastion approve` does, and the prompt is withdrawn.
    silent = Person(None)
    waiting = asyncio.create_task(call(gateway, session(client=silent), "raw__big", {"size": 2}))
    for _ in range(200):
        if queue.pending():
            break
        await asyncio.sleep(0.05)
    [request] = queue.pending()
    assert len(silent.asked) == 1
    await asyncio.to_thread(queue.settle, request.id, True, "bob")
    assert (await waiting)["content"][0]["text"] == "xx"

    # The person answers in the client first: the queue request is closed as answered there.
    prompt = Person(ACCEPT)
    assert (await call(gateway, session(client=prompt), "raw__big", {"size": 1}))["content"][0]["text"] == "x"
    answered = [item for item in queue.all() if item.id != request.id]
    assert [(i.status, i.record.get("why")) for i in answered] == [("approved", "answered in the client")]


async def test_a_retry_that_continues_a_call_is_checked_again_but_neither_counted_nor_asked_again(
        tmp_path: Path, gateway_factory) -> None:
    config = policy_config(tmp_path, rate_limits=[{"scope": "tool", "match": "raw/big", "rate": 0.001, "burst": 1}])
    gateway, runtime = await gateway_factory(config, clock=lambda: 100.0)
    person = Person(ACCEPT)
    continued: list[str] = []

    async def resume(message: GatewayRequest) -> dict:
        continued.append(message.params["name"])
        return {}

    def retry(name: str) -> GatewayRequest:
        return GatewayRequest("tools/call", {"name": name, "arguments": {"size": 1}}, session(client=person),
                              gateway.catalog, request_id=2, continues=True, deliver=resume)

    await call(gateway, session(client=person), "raw__big", {"size": 1})  # approved by the person, the one token used
    assert len(person.asked) == 1
    assert await gateway.handle(retry("raw__big")) == {}  # neither rate limited nor asked again
    assert continued == ["raw__big"] and len(person.asked) == 1
    # A forbid still forbids a retry: the policy checks it again.
    assert (await refusal(gateway.handle(retry("raw__crash")))).data["rule"] == "no-crash"
    await runtime.aclose()
    outcomes = [r["outcome"] for r in map(json.loads, (tmp_path / "audit.jsonl").read_text().splitlines())
                if r["kind"] == "call"]
    assert outcomes == ["complete", "continued", -32001]
