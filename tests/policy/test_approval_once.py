"""One approval is one execution: the policy stage in front of the real gateway and real servers, in process.

A 2026-07-28 approval (``requestState``) runs its call once however often, and however concurrently, it is sent;
the same call sent again without it asks again; a server of that era that asks for input of its own after the
approval continues the one approved call round by round, each round's state good once; the opt-in
``policy.approval.reuse_seconds`` lets the identical call through for that long and no longer; and the
handshake-era prompt is asked again for every call. Executions are counted by the raw server, which marks every
``tools/call`` it gets; a call that needs no approval, answered after the others, settles the count (the server
handles its input in order).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Awaitable, Mapping

import pydantic
import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, ServerConfig
from bastion.gateway.core import Gateway
from bastion.model import GatewayError, Identity, Session
from bastion.policy.approval import STATE_PREFIX
from bastion.policy.config import ApprovalConfig, PolicyConfig
from bastion.policy.interceptors import PolicyRuntime, build_policy_runtime

from tests.policy.test_pipeline import ACCEPT, ALICE, DECLINE, POLICY, Person, call, session
from tests.support import FIXTURES

BIG = "raw__big"  # needs a person's approval under POLICY; echo does not
REPLAYS = 5


def policy_config(tmp_path: Path, **approval: Any) -> PolicyConfig:
    (tmp_path / "policy.cedar").write_text(POLICY)
    return PolicyConfig.model_validate({
        "policy_files": ["policy.cedar"], "base_dir": str(tmp_path), "audit": {"path": str(tmp_path / "audit.jsonl")},
        "approval": {"timeout_seconds": 120, "queue_dir": str(tmp_path / "queue"), "poll_seconds": 0.05, **approval},
    })


@pytest.fixture()
async def gateway_factory(tmp_path: Path):
    started: list[Any] = []

    async def make(config: PolicyConfig, servers: Mapping[str, ServerConfig] | None = None,
                   **options: Any) -> tuple[Gateway, PolicyRuntime]:
        """A gateway in front of ``servers`` (the raw server, counting its calls, by default) and its policy;
        ``options`` go to ``build_policy_runtime``."""
        runtime = build_policy_runtime(config, **options)
        servers = servers or {"raw": ServerConfig(
            command=sys.executable, args=[str(FIXTURES / "raw_server.py")], trust="trusted", sandbox="none",
            env={"RAW_SERVER_MARKS": str(tmp_path / "marks"), "RAW_SERVER_MARK_CALLS": "1"})}
        gateway = build_gateway(GatewayConfig(servers=dict(servers), policy=None), interceptors=runtime.interceptors)
        gateway.start({"elicitation": {}})
        await gateway.wait_ready(60)
        started.append((gateway, runtime))
        return gateway, runtime

    yield make
    for gateway, runtime in started:
        await runtime.aclose()
        await gateway.close()


async def executions(gateway: Gateway, tmp_path: Path, tool: str = "big") -> int:
    """How many calls of ``tool`` reached the raw server, once everything sent before has been handled."""
    settled = await call(gateway, session(), "raw__echo", {"text": "settled"})
    assert settled["content"][0]["text"] == "settled"
    marks = (tmp_path / "marks").read_text().splitlines() if (tmp_path / "marks").exists() else []
    return sum(1 for line in marks
               if line.startswith("call ") and json.loads(line[5:])["params"]["name"] == tool)


async def outcome(awaitable: Awaitable[Any]) -> Any:
    """The call's result, or the GatewayError it was refused with."""
    try:
        return await awaitable
    except GatewayError as error:
        return error


_sessions = itertools.count(1)


def modern(identity: Identity = ALICE) -> Session:
    """A 2026-07-28 caller whose client takes elicitation: each one a session of its own, as each HTTP POST is."""
    return Session(identity, "modern", "2026-07-28", {"elicitation": {}}, {"name": "test"}, f"post-{next(_sessions)}")


def approved(state: str) -> dict[str, Any]:
    return {"requestState": state, "inputResponses": {"approval": ACCEPT}}


def assert_replay_refused(error: Any) -> None:
    assert isinstance(error, GatewayError), error
    assert error.code == -32001
    assert error.message == ("Call to 'raw__big' was not approved: this approval was already used (one approval "
                             "runs one call); send the call again without requestState to ask again")
    assert error.data["reason"].startswith("approval refused: this approval was already used")


async def test_one_request_state_runs_its_call_once_however_often_it_is_sent(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    asked = await call(gateway, modern(), BIG, {"size": 3})
    assert asked["resultType"] == "input_required"
    outcomes = [await outcome(call(gateway, modern(), BIG, {"size": 3}, **approved(asked["requestState"])))
                for _ in range(REPLAYS)]
    assert outcomes[0]["content"][0]["text"] == "xxx"
    for replay in outcomes[1:]:
        assert_replay_refused(replay)
    assert await executions(gateway, tmp_path) == 1


async def test_concurrent_retries_with_one_state_run_the_call_once(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    asked = await call(gateway, modern(), BIG, {"size": 2})
    retry = approved(asked["requestState"])
    outcomes = await asyncio.gather(*(outcome(call(gateway, modern(), BIG, {"size": 2}, **retry)) for _ in range(REPLAYS)))
    ran = [o for o in outcomes if isinstance(o, dict)]
    assert len(ran) == 1 and ran[0]["content"][0]["text"] == "xx"
    for replay in (o for o in outcomes if not isinstance(o, dict)):
        assert_replay_refused(replay)
    assert await executions(gateway, tmp_path) == 1


async def test_the_same_call_sent_again_without_the_state_asks_again(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    first = await call(gateway, modern(), BIG, {"size": 4})
    done = await call(gateway, modern(), BIG, {"size": 4}, **approved(first["requestState"]))
    assert done["content"][0]["text"] == "xxxx"
    # The identical call, with no state and even with the approving answer, is asked about again.
    for extra in ({}, {"inputResponses": {"approval": ACCEPT}}):
        again = await call(gateway, modern(), BIG, {"size": 4}, **extra)
        assert again["resultType"] == "input_required", again
        assert again["requestState"] != first["requestState"]
    assert await executions(gateway, tmp_path) == 1
    # The new state approves one more run, and only one.
    assert (await call(gateway, modern(), BIG, {"size": 4}, **approved(again["requestState"])))["content"]
    assert_replay_refused(await outcome(call(gateway, modern(), BIG, {"size": 4}, **approved(again["requestState"]))))
    assert await executions(gateway, tmp_path) == 2


async def test_a_declined_state_is_used_up_too(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    asked = await call(gateway, modern(), BIG, {"size": 1})
    state = asked["requestState"]
    declined = await outcome(call(gateway, modern(), BIG, {"size": 1}, requestState=state,
                                  inputResponses={"approval": DECLINE}))
    assert isinstance(declined, GatewayError) and "declined" in declined.message
    assert_replay_refused(await outcome(call(gateway, modern(), BIG, {"size": 1}, **approved(state))))
    assert await executions(gateway, tmp_path) == 0


# --- the opt-in reuse window -----------------------------------------------------------------------------

def test_reuse_seconds_is_off_by_default_and_validated() -> None:
    assert ApprovalConfig().reuse_seconds == 0
    assert ApprovalConfig(reuse_seconds=30).reuse_seconds == 30
    for bad in (-1, 3601, float("inf"), float("nan"), "soon"):
        with pytest.raises(pydantic.ValidationError):
            ApprovalConfig(reuse_seconds=bad)


async def test_reuse_seconds_lets_the_identical_call_through_for_that_long(tmp_path: Path, gateway_factory) -> None:
    now = [1000.0]
    gateway, runtime = await gateway_factory(policy_config(tmp_path, reuse_seconds=30), clock=lambda: now[0])
    first = await call(gateway, modern(), BIG, {"size": 5})
    assert (await call(gateway, modern(), BIG, {"size": 5}, **approved(first["requestState"])))["content"]
    # Within the window the identical call runs without asking, from any session of the same caller.
    now[0] += 29
    reused = await call(gateway, modern(), BIG, {"size": 5})
    assert reused["content"][0]["text"] == "xxxxx"
    assert await executions(gateway, tmp_path) == 2
    # A state stays good once, window or not; other arguments, or another caller, are asked about.
    assert_replay_refused(await outcome(call(gateway, modern(), BIG, {"size": 5}, **approved(first["requestState"]))))
    assert (await call(gateway, modern(), BIG, {"size": 6}))["resultType"] == "input_required"
    other = Identity("bob", ("dev",))
    assert (await call(gateway, modern(other), BIG, {"size": 5}))["resultType"] == "input_required"
    # Past the window, the identical call asks again.
    now[0] += 2
    assert (await call(gateway, modern(), BIG, {"size": 5}))["resultType"] == "input_required"
    assert await executions(gateway, tmp_path) == 2
    await runtime.aclose()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in records if r["kind"] == "decision" and r["rule"] == "approval:reused"] == \
        ["a person approved the identical call less than 30 s ago (policy.approval.reuse_seconds)"]


async def test_reuse_seconds_holds_for_a_handshake_era_prompt_too(tmp_path: Path, gateway_factory) -> None:
    now = [1000.0]
    gateway, _ = await gateway_factory(policy_config(tmp_path, reuse_seconds=10), clock=lambda: now[0])
    person = Person(ACCEPT)
    for _ in range(3):
        assert (await call(gateway, session(client=person), BIG, {"size": 1}))["content"]
    assert len(person.asked) == 1
    now[0] += 11
    assert (await call(gateway, session(client=person), BIG, {"size": 1}))["content"]
    assert len(person.asked) == 2
    assert await executions(gateway, tmp_path) == 4


# --- the handshake era ------------------------------------------------------------------------------------

async def test_a_handshake_era_prompt_is_asked_again_for_every_call(tmp_path: Path, gateway_factory) -> None:
    gateway, _ = await gateway_factory(policy_config(tmp_path))
    person = Person(ACCEPT)
    who = session(client=person)
    for _ in range(3):
        assert (await call(gateway, who, BIG, {"size": 1}))["content"][0]["text"] == "x"
    assert len(person.asked) == 3
    assert await executions(gateway, tmp_path) == 3


# --- a 2026-07-28 server that asks for input of its own after the approval ---------------------------------

MULTI_ROUND = "fx__test_input_required_result_multi_round"


async def test_a_modern_servers_own_rounds_continue_the_one_approved_call(tmp_path: Path, gateway_factory) -> None:
    events = tmp_path / "events.log"
    servers = {"fx": ServerConfig(command=sys.executable, args=[str(FIXTURES / "sdk_server.py")], era="modern",
                                  sandbox="none", env={"FIXTURE_EVENTS": str(events)})}
    # The default policy: every tool of an untrusted server waits for a person.
    config = PolicyConfig.model_validate({"audit": {"path": str(tmp_path / "audit.jsonl")},
                                          "approval": {"timeout_seconds": 120, "queue_dir": str(tmp_path / "queue")}})
    gateway, _ = await gateway_factory(config, servers)
    asked = await call(gateway, modern(), MULTI_ROUND, {})
    assert set(asked["inputRequests"]) == {"approval"}
    first = await call(gateway, modern(), MULTI_ROUND, {}, **approved(asked["requestState"]))
    assert set(first["inputRequests"]) == {"step1"}
    step1 = {"requestState": first["requestState"],
             "inputResponses": {"step1": {"action": "accept", "content": {"name": "Ada"}}}}
    second = await call(gateway, modern(), MULTI_ROUND, {}, **step1)
    assert set(second["inputRequests"]) == {"step2"}
    # Each round's state is good once: the round sent again is refused, not run again.
    replayed = await outcome(call(gateway, modern(), MULTI_ROUND, {}, **step1))
    assert isinstance(replayed, GatewayError) and replayed.code == -32001 and "already used" in replayed.message
    # The server's state travels inside one of Bastion's.
    assert first["requestState"].startswith(STATE_PREFIX) and second["requestState"].startswith(STATE_PREFIX)
    done = await call(gateway, modern(), MULTI_ROUND, {}, requestState=second["requestState"],
                      inputResponses={"step2": {"action": "accept", "content": {"color": "blue"}}})
    assert done["content"][0]["text"] == "Ada likes blue."
    # A round's state is bound to the call: other arguments, or another caller, cannot use it.
    other = await outcome(call(gateway, modern(Identity("bob", ("dev",))), MULTI_ROUND, {}, **step1))
    assert isinstance(other, GatewayError) and "different call" in other.message
