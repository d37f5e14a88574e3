"""The legacy lifecycle, state by event: every cell of both tables, then random event sequences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.protocol.jsonrpc import INVALID_REQUEST, ErrorResponse, Message, Notification, Request, Response
from bastion.protocol.lifecycle import Action, ClientLifecycle, ServerLifecycle, State, Verdict
from bastion.protocol.versions import LATEST_MODERN, LEGACY_VERSIONS

from tests.properties import PROPERTY

U, I, A, S = State.UNINITIALIZED, State.INITIALIZING, State.ACTIVE, State.SHUTDOWN

# ================================================================================ server side (the frontend)
INITIALIZE = Request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}})
SERVER_EVENTS: dict[str, Message | str] = {
    "initialize": INITIALIZE,
    "ping": Request("p", "ping", None),
    "tools/call": Request(5, "tools/call", {"name": "t", "arguments": {}}),
    "tools/list": Request("list", "tools/list", None),
    "notifications/initialized": Notification("notifications/initialized", None),
    "notifications/cancelled": Notification("notifications/cancelled", {"requestId": 5}),
    "ping notification": Notification("ping", None),
    "response": Response(9, {}),
    "error response": ErrorResponse(9, {"code": -32601, "message": "no"}),
    "transport dropped": "drop",
    "close": "close",
}


def drive_server(event: Message | str, lifecycle: ServerLifecycle) -> Verdict:
    if event == "drop":
        return lifecycle.transport_dropped()
    if event == "close":
        return lifecycle.close()
    assert not isinstance(event, str)
    return lifecycle.receive(event)


def server_in(state: State) -> ServerLifecycle:
    lifecycle = ServerLifecycle()
    steps = {U: [], I: [INITIALIZE], A: [INITIALIZE, SERVER_EVENTS["notifications/initialized"]], S: ["close"]}[state]
    for step in steps:
        drive_server(step, lifecycle)
    assert lifecycle.state is state
    return lifecycle


# (action, does the reply carry -32600 under the request's id, next state); None for "the table is silent".
ACCEPT, REJECT, CLOSE, IGNORE, ABORT = Action.ACCEPT, Action.REJECT, Action.REJECT_AND_CLOSE, Action.IGNORE, Action.ABORT
SERVER_TABLE: dict[State, dict[str, tuple[Action, bool, State]]] = {
    U: {
        "initialize": (ACCEPT, False, I),
        "ping": (ACCEPT, False, U),
        "tools/call": (CLOSE, True, S),
        "tools/list": (CLOSE, True, S),
        "notifications/initialized": (CLOSE, False, S),
        "notifications/cancelled": (CLOSE, False, S),
        "ping notification": (CLOSE, False, S),
        "response": (CLOSE, False, S),
        "error response": (CLOSE, False, S),
        "transport dropped": (ABORT, False, S),
        "close": (ABORT, False, S),
    },
    I: {
        "initialize": (REJECT, True, I),
        "ping": (ACCEPT, False, I),
        "tools/call": (REJECT, True, I),
        "tools/list": (REJECT, True, I),
        "notifications/initialized": (ACCEPT, False, A),
        "notifications/cancelled": (ACCEPT, False, I),
        "ping notification": (ACCEPT, False, I),
        "response": (ACCEPT, False, I),
        "error response": (ACCEPT, False, I),
        "transport dropped": (ABORT, False, S),
        "close": (ABORT, False, S),
    },
    A: {
        "initialize": (REJECT, True, A),
        "ping": (ACCEPT, False, A),
        "tools/call": (ACCEPT, False, A),
        "tools/list": (ACCEPT, False, A),
        "notifications/initialized": (ACCEPT, False, A),
        "notifications/cancelled": (ACCEPT, False, A),
        "ping notification": (ACCEPT, False, A),
        "response": (ACCEPT, False, A),
        "error response": (ACCEPT, False, A),
        "transport dropped": (ABORT, False, S),
        "close": (ABORT, False, S),
    },
    S: {event: (IGNORE, False, S) for event in SERVER_EVENTS},
}


def test_server_table_covers_every_state_and_event() -> None:
    assert set(SERVER_TABLE) == set(State)
    for row in SERVER_TABLE.values():
        assert set(row) == set(SERVER_EVENTS)


@pytest.mark.parametrize(
    ("state", "event"), [(s, e) for s in State for e in SERVER_EVENTS], ids=[f"{s.name}-{e}" for s in State for e in SERVER_EVENTS]
)
def test_server_state_by_event(state: State, event: str) -> None:
    lifecycle = server_in(state)
    action, replies, next_state = SERVER_TABLE[state][event]
    message = SERVER_EVENTS[event]
    verdict = drive_server(message, lifecycle)
    assert verdict.action is action
    assert lifecycle.state is next_state
    if replies:
        assert isinstance(message, Request)
        assert verdict.reply is not None
        assert verdict.reply.id == message.id
        assert verdict.reply.error["code"] == INVALID_REQUEST
        assert verdict.reply.error["message"]
    else:
        assert verdict.reply is None


def test_initialize_params_are_kept_for_the_frontend() -> None:
    lifecycle = ServerLifecycle()
    assert lifecycle.client_params is None
    lifecycle.receive(INITIALIZE)
    assert lifecycle.client_params == INITIALIZE.params


def test_initialize_without_params_is_kept_as_an_empty_object() -> None:
    lifecycle = ServerLifecycle()
    assert lifecycle.receive(Request(1, "initialize", None)).action is Action.ACCEPT
    assert lifecycle.client_params == {}


def test_a_second_initialize_does_not_replace_the_first_params() -> None:
    lifecycle = server_in(I)
    lifecycle.receive(Request(2, "initialize", {"protocolVersion": "2024-11-05"}))
    assert lifecycle.client_params == INITIALIZE.params


def test_rejection_before_the_handshake_says_to_initialize_first() -> None:
    verdict = ServerLifecycle().receive(Request(3, "tools/call", {}))
    assert verdict.reply is not None and "initialize" in verdict.reply.error["message"]


def test_rejection_while_initializing_says_what_is_missing() -> None:
    verdict = server_in(I).receive(Request(3, "tools/call", {}))
    assert verdict.reply is not None and "notifications/initialized" in verdict.reply.error["message"]


# Random sequences, checked against the table: the machine carries no hidden state beyond its State.
SERVER_EVENT_NAMES = st.sampled_from(sorted(SERVER_EVENTS))


@PROPERTY
@given(st.lists(SERVER_EVENT_NAMES, max_size=25))
def test_server_follows_the_table_for_any_sequence(events: list[str]) -> None:
    lifecycle = ServerLifecycle()
    expected = U
    for event in events:
        action, replies, expected = SERVER_TABLE[expected][event]
        verdict = drive_server(SERVER_EVENTS[event], lifecycle)
        assert (verdict.action, verdict.reply is not None, lifecycle.state) == (action, replies, expected)


@PROPERTY
@given(st.lists(SERVER_EVENT_NAMES, max_size=25))
def test_shutdown_is_final(events: list[str]) -> None:
    lifecycle = server_in(S)
    for event in events:
        assert drive_server(SERVER_EVENTS[event], lifecycle) == Verdict(Action.IGNORE)
        assert lifecycle.state is S


# ===================================================================== client side (upstream connections)
def good_result(version: str = "2025-11-25") -> Response:
    return Response(1, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "s"}})


ANSWERS: dict[str, Response | ErrorResponse] = {
    "good result": good_result(),
    "error": ErrorResponse(1, {"code": -32602, "message": "unsupported protocol version"}),
    "modern version": good_result(LATEST_MODERN),
    "unknown version": good_result("2023-01-01"),
    "missing version": Response(1, {"capabilities": {}}),
    "capabilities not an object": Response(1, {"protocolVersion": "2025-11-25", "capabilities": ["tools"]}),
}


@dataclass(frozen=True)
class ClientOutcome:
    state: State
    problem: str | None = None  # a substring of what initialize_answered returns; None when it returns None
    raises: bool = False


def client_in(state: State) -> ClientLifecycle:
    lifecycle = ClientLifecycle(LEGACY_VERSIONS)
    if state is not U:
        lifecycle.start()
    if state in (A, S):
        if state is A:
            assert lifecycle.initialize_answered(good_result()) is None
            lifecycle.initialized_sent()
        else:
            lifecycle.transport_dropped()
    assert lifecycle.state is state
    return lifecycle


def client_start(lifecycle: ClientLifecycle) -> object:
    return lifecycle.start()


CLIENT_ANSWER_TABLE: dict[State, dict[str, ClientOutcome]] = {
    U: {name: ClientOutcome(U, "initialize answered in state uninitialized") for name in ANSWERS},
    I: {
        "good result": ClientOutcome(I, None),
        "error": ClientOutcome(S, "initialize failed: unsupported protocol version"),
        "modern version": ClientOutcome(S, "'2026-07-28', which Bastion does not speak"),
        "unknown version": ClientOutcome(S, "'2023-01-01', which Bastion does not speak"),
        "missing version": ClientOutcome(S, "None, which Bastion does not speak"),
        "capabilities not an object": ClientOutcome(S, "capabilities are not an object"),
    },
    A: {name: ClientOutcome(A, "initialize answered in state active") for name in ANSWERS},
    S: {name: ClientOutcome(S, "initialize answered in state shutdown") for name in ANSWERS},
}


@pytest.mark.parametrize(
    ("state", "answer"), [(s, a) for s in State for a in ANSWERS], ids=[f"{s.name}-{a}" for s in State for a in ANSWERS]
)
def test_client_initialize_answered_by_state(state: State, answer: str) -> None:
    lifecycle = client_in(state)
    outcome = CLIENT_ANSWER_TABLE[state][answer]
    problem = lifecycle.initialize_answered(ANSWERS[answer])
    if outcome.problem is None:
        assert problem is None
        assert lifecycle.server_result == ANSWERS[answer].result
    else:
        assert problem is not None and outcome.problem in problem
    assert lifecycle.state is outcome.state


@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_client_accepts_every_legacy_version(version: str) -> None:
    lifecycle = client_in(I)
    assert lifecycle.initialize_answered(good_result(version)) is None
    lifecycle.initialized_sent()
    assert lifecycle.state is A


def test_client_accepts_a_result_without_capabilities_as_none_declared() -> None:
    lifecycle = client_in(I)
    assert lifecycle.initialize_answered(Response(1, {"protocolVersion": "2025-06-18"})) is None


@pytest.mark.parametrize(("state", "raises", "after"), [(U, False, I), (I, True, I), (A, True, A), (S, True, S)])
def test_client_start_by_state(state: State, raises: bool, after: State) -> None:
    lifecycle = client_in(state)
    if raises:
        with pytest.raises(RuntimeError, match=f"initialize sent in state {state.value}"):
            lifecycle.start()
    else:
        lifecycle.start()
    assert lifecycle.state is after


@pytest.mark.parametrize(
    ("state", "answered", "after"),
    [(U, False, U), (I, False, I), (I, True, A), (A, True, A), (S, False, S)],
)
def test_client_initialized_sent_by_state(state: State, answered: bool, after: State) -> None:
    lifecycle = client_in(state)
    if state is I and answered:
        lifecycle.initialize_answered(good_result())
    lifecycle.initialized_sent()
    assert lifecycle.state is after


def test_client_failed_answer_cannot_be_followed_by_initialized() -> None:
    lifecycle = client_in(I)
    assert lifecycle.initialize_answered(ANSWERS["error"]) is not None
    lifecycle.initialized_sent()
    assert lifecycle.state is S


MAY_SEND: dict[State, dict[str, bool]] = {
    U: {"initialize": True, "ping": True, "tools/call": False, "tools/list": False, "notifications/initialized": False},
    I: {"initialize": False, "ping": True, "tools/call": False, "tools/list": False, "notifications/initialized": False},
    A: {"initialize": True, "ping": True, "tools/call": True, "tools/list": True, "notifications/initialized": True},
    S: {"initialize": False, "ping": False, "tools/call": False, "tools/list": False, "notifications/initialized": False},
}


@pytest.mark.parametrize(
    ("state", "method"), [(s, m) for s in State for m in MAY_SEND[s]], ids=[f"{s.name}-{m}" for s in State for m in MAY_SEND[s]]
)
def test_client_may_send_by_state(state: State, method: str) -> None:
    assert client_in(state).may_send(method) is MAY_SEND[state][method]


@pytest.mark.parametrize(("state", "action"), [(U, ABORT), (I, ABORT), (A, ABORT), (S, IGNORE)])
def test_client_transport_dropped_by_state(state: State, action: Action) -> None:
    lifecycle = client_in(state)
    assert lifecycle.transport_dropped() == Verdict(action)
    assert lifecycle.state is S
    assert lifecycle.transport_dropped() == Verdict(IGNORE), "a second drop has nothing left to abort"


CLIENT_STEPS: dict[str, Callable[[ClientLifecycle], object]] = {
    "start": client_start,
    "good answer": lambda lc: lc.initialize_answered(good_result()),
    "error answer": lambda lc: lc.initialize_answered(ANSWERS["error"]),
    "initialized sent": lambda lc: lc.initialized_sent(),
    "dropped": lambda lc: lc.transport_dropped(),
}


@PROPERTY
@given(st.lists(st.sampled_from(sorted(CLIENT_STEPS)), max_size=20))
def test_client_only_reaches_active_through_the_handshake(steps: list[str]) -> None:
    lifecycle = ClientLifecycle(LEGACY_VERSIONS)
    history: list[str] = []
    for step in steps:
        try:
            CLIENT_STEPS[step](lifecycle)
        except RuntimeError:
            assert step == "start" and lifecycle.state is not U
        history.append(step)
        if lifecycle.state is A:
            # ACTIVE needs start, then a good answer while initializing, then initialized_sent, in that order.
            first_start = history.index("start")
            good = history.index("good answer", first_start)
            assert "error answer" not in history[first_start:good]
            assert "initialized sent" in history[good:]
            assert "dropped" not in history
        if "dropped" in history:
            assert lifecycle.state is S
            assert not lifecycle.may_send("ping")
