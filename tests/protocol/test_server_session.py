"""The sans-I/O server session: messages in, replies and events out, for both eras, then random sequences."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.protocol.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
    ErrorResponse,
    Notification,
    Request,
    Response,
)
from bastion.protocol.lifecycle import State
from bastion.protocol.server_session import (
    LOG_LEVELS,
    Answered,
    Cancel,
    CloseConnection,
    Discover,
    Initialize,
    Invalid,
    MAX_SUBSCRIPTIONS,
    Listen,
    Notified,
    RootsChanged,
    Send,
    Serve,
    ServerSession,
    UnknownAnswer,
    at_least,
    legacy_result,
)
from bastion.protocol.versions import (
    LATEST_LEGACY,
    LATEST_MODERN,
    META_CLIENT_CAPABILITIES,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
    META_SUBSCRIPTION_ID,
)

from tests.properties import JSON_OBJECTS, PROPERTY, REQUEST_IDS

SERVER_INFO = {"name": "bastion", "version": "test"}
CAPS = {"tools": {"listChanged": True}, "prompts": {"listChanged": True}, "resources": {"subscribe": True}}
INITIALIZE = Request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {"sampling": {}},
                                       "clientInfo": {"name": "c", "version": "1"}})
INITIALIZED = Notification("notifications/initialized", None)


def session() -> ServerSession:
    return ServerSession(server_info=SERVER_INFO, max_message_bytes=10_000)


def frame(value: Any) -> bytes:
    return orjson.dumps(value)


def modern_params(**extra: Any) -> dict[str, Any]:
    meta = {META_PROTOCOL_VERSION: LATEST_MODERN, META_CLIENT_CAPABILITIES: {"elicitation": {}}}
    meta.update(extra.pop("meta", {}))
    return {**extra, "_meta": meta}


def legacy_ready() -> ServerSession:
    s = session()
    [init] = s.receive(INITIALIZE)
    assert isinstance(init, Initialize)
    s.initialize_result(init.request, CAPS, None)
    s.request_done(1)
    assert s.receive(INITIALIZED) == [Notified("notifications/initialized", None)]  # it still passes the chain
    return s


# ========================================================================================= frames
def test_blank_frames_are_no_message_and_decide_no_era() -> None:
    s = session()
    assert s.receive_frame(b"") == [] and s.receive_frame(b"  \t") == []
    assert s.era is None


def test_malformed_json_is_answered_with_a_parse_error_and_reported() -> None:
    s = session()
    send, invalid = s.receive_frame(b"{not json")
    assert isinstance(send, Send) and send.message.error["code"] == PARSE_ERROR
    assert isinstance(invalid, Invalid) and "malformed JSON" in invalid.reason
    assert s.era is None  # garbage says nothing about the era


def test_a_frame_over_the_limit_is_refused_with_the_limit_named() -> None:
    [send] = session().frame_too_large(20_000)
    assert send.message.id is None and send.message.error["code"] == INVALID_REQUEST
    assert "20000" in send.message.error["message"] and "10000" in send.message.error["message"]


def test_an_invalid_response_is_reported_but_never_answered() -> None:
    events = session().receive_frame(frame({"jsonrpc": "2.0", "id": 3}))
    assert [type(e) for e in events] == [Invalid]


# ==================================================================================== era detection
@pytest.mark.parametrize("message, era", [
    (INITIALIZE, "legacy"),
    (Request(1, "tools/list", None), "legacy"),
    (Request(1, "server/discover", None), "modern"),
    (Request(1, "tools/list", {"_meta": {META_PROTOCOL_VERSION: "1999-01-01"}}), "modern"),
    (Notification("notifications/initialized", None), "legacy"),
])
def test_the_first_message_decides_the_era(message: Any, era: str) -> None:
    s = session()
    s.receive(message)
    assert s.era == era


def test_a_transport_that_knows_the_era_says_so() -> None:
    s = ServerSession(server_info=SERVER_INFO, era="modern")
    [serve] = s.receive(Request(1, "tools/list", modern_params()))
    assert isinstance(serve, Serve) and serve.era == "modern"


# ======================================================================================= handshake era
def test_initialize_negotiates_the_version_and_keeps_what_the_client_declared() -> None:
    s = session()
    [init] = s.receive(INITIALIZE)
    assert isinstance(init, Initialize)
    assert init.protocol_version == "2025-06-18" and init.client_capabilities == {"sampling": {}}
    assert s.client_capabilities == {"sampling": {}} and s.client_info == {"name": "c", "version": "1"}
    reply = s.initialize_result(init.request, CAPS, "be nice")
    assert reply == Response(1, {"protocolVersion": "2025-06-18", "capabilities": CAPS, "serverInfo": SERVER_INFO,
                                 "instructions": "be nice"})


def test_an_unknown_version_is_answered_with_the_latest_and_bad_fields_are_read_as_absent() -> None:
    s = session()
    [init] = s.receive(Request(1, "initialize", {"protocolVersion": "1.0", "capabilities": [], "clientInfo": "x"}))
    assert init.protocol_version == LATEST_LEGACY
    assert init.client_capabilities == {} and init.client_info is None
    assert "instructions" not in s.initialize_result(init.request, {}, None).result


def test_requests_before_initialize_close_the_connection_except_ping() -> None:
    s = session()
    assert [type(e) for e in s.receive(Request(7, "ping", None))] == [Serve]
    assert s.lifecycle.state is State.UNINITIALIZED
    send, close = s.receive(Request(8, "tools/list", None))
    assert isinstance(close, CloseConnection) and send.message.error["code"] == INVALID_REQUEST
    assert s.receive(INITIALIZE) == []  # the connection is shut: nothing more is served


def test_requests_during_the_handshake_are_refused_but_the_connection_stays() -> None:
    s = session()
    s.receive(INITIALIZE)
    [send] = s.receive(Request(2, "tools/list", None))
    assert "notifications/initialized" in send.message.error["message"]
    s.receive(INITIALIZED)
    [serve] = s.receive(Request(3, "tools/list", None))
    assert isinstance(serve, Serve) and serve.log_level == "debug" and serve.protocol_version == "2025-06-18"
    assert serve.client_capabilities == {"sampling": {}}


def test_a_second_initialize_is_refused() -> None:
    s = legacy_ready()
    [send] = s.receive(Request(9, "initialize", {}))
    assert send.message.error["code"] == INVALID_REQUEST and "already initialized" in send.message.error["message"]


def test_nothing_reaches_the_client_before_its_initialize_result() -> None:
    s = session()
    [init] = s.receive(INITIALIZE)
    s.receive(INITIALIZED)  # pipelined ahead of reading the result
    assert s.list_changed("notifications/tools/list_changed") == []
    assert s.log_message({"level": "error", "data": "x"}) == []
    assert s.resource_updated({"uri": "a://b"}) == []
    assert not s.wants("logs")
    s.initialize_result(init.request, CAPS, None)
    assert s.list_changed("notifications/tools/list_changed") == [Notification("notifications/tools/list_changed", None)]
    assert s.resource_updated({"uri": "a://b"}) == [Notification("notifications/resources/updated", {"uri": "a://b"})]


def test_set_level_filters_logs_and_is_still_served() -> None:
    s = legacy_ready()
    assert s.log_message({"level": "debug"})  # every level until the client sets one
    [serve] = s.receive(Request(5, "logging/setLevel", {"level": "warning"}))
    assert isinstance(serve, Serve) and serve.log_level == "warning"
    assert s.log_message({"level": "info"}) == []
    assert s.log_message({"level": "error", "data": 1}) == [Notification("notifications/message", {"level": "error", "data": 1})]
    assert s.log_message({"level": "no-such-level"})  # a level Bastion does not know is never dropped


def test_an_invalid_log_level_is_refused_and_changes_nothing() -> None:
    s = legacy_ready()
    [send] = s.receive(Request(5, "logging/setLevel", {"level": "loud"}))
    assert send.message.error["code"] == INVALID_PARAMS and "'loud'" in send.message.error["message"]
    assert s.log_level is None
    assert s.receive(Request(5, "ping", None))  # nothing was left in flight under that id


def test_a_request_id_in_flight_is_refused_until_it_is_done() -> None:
    s = legacy_ready()
    [serve] = s.receive(Request(4, "tools/call", {"name": "t"}))
    assert isinstance(serve, Serve)
    [send] = s.receive(Request(4, "tools/list", None))
    assert "already in flight" in send.message.error["message"]
    s.request_done(4)
    assert isinstance(s.receive(Request(4, "tools/list", None))[0], Serve)


def test_cancellation_names_only_requests_in_flight() -> None:
    s = legacy_ready()
    s.receive(Request("a", "tools/call", {}))
    assert s.receive(Notification("notifications/cancelled", {"requestId": "a"})) == [Cancel("a")]
    # A cancel of nothing in flight has no effect, and still passes the gateway's chain.
    assert s.receive(Notification("notifications/cancelled", {"requestId": "zzz"})) == [
        Notified("notifications/cancelled", {"requestId": "zzz"})]
    assert s.receive(Notification("notifications/cancelled", None)) == [Notified("notifications/cancelled", None)]


@pytest.mark.parametrize("request_id", [{"a": 1}, [1], True, 1.0])
def test_a_cancel_naming_no_id_cancels_nothing_and_keeps_the_session(request_id: Any) -> None:
    # Found by tests/fuzz/fuzz_server_session.py: an object as requestId raised TypeError (unhashable) out of the
    # session, and true or 1.0 cancelled request 1, as Python holds them equal to it.
    s = legacy_ready()
    s.receive(Request(1, "tools/call", {}))
    cancel = Notification("notifications/cancelled", {"requestId": request_id})
    assert s.receive(cancel) == [Notified("notifications/cancelled", {"requestId": request_id})]
    assert s.in_flight() == {1}


def test_roots_changed_and_unknown_notifications() -> None:
    s = legacy_ready()
    assert s.receive(Notification("notifications/roots/list_changed", None)) == [RootsChanged()]
    assert s.receive(Notification("notifications/whatever", {})) == [Notified("notifications/whatever", {})]


def test_answers_to_bastions_requests_are_told_apart_from_strays() -> None:
    s = legacy_ready()
    request = s.outgoing_request("sampling/createMessage", {"messages": []})
    assert isinstance(request.id, str) and request.method == "sampling/createMessage"
    second = s.outgoing_request("roots/list", {})
    assert second.id != request.id
    answer = Response(request.id, {"role": "assistant"})
    assert s.receive(answer) == [Answered(request.id, answer)]
    assert s.receive(answer) == [UnknownAnswer(request.id)]  # answered once only
    assert s.receive(Response(12, {})) == [UnknownAnswer(12)]
    assert s.outgoing_abandoned(second.id) == Notification("notifications/cancelled", {"requestId": second.id})
    assert s.receive(ErrorResponse(second.id, {"code": 1, "message": "late"})) == [UnknownAnswer(second.id)]


def test_a_lost_connection_serves_nothing_more() -> None:
    s = legacy_ready()
    s.connection_lost()
    assert s.receive(Request(1, "tools/list", None)) == []
    assert s.lifecycle.state is State.SHUTDOWN


def test_results_for_a_handshake_era_client_lose_the_modern_envelope() -> None:
    s = legacy_ready()
    modern = {"content": [], "resultType": "complete",
              "_meta": {META_SERVER_INFO: {"name": "x"}, "app/keep": 1}}
    assert s.result(3, "tools/call", modern) == Response(3, {"content": [], "_meta": {"app/keep": 1}})
    assert s.result(3, "tools/call", {"content": [], "_meta": {META_SERVER_INFO: {}}}).result == {"content": []}


# ======================================================================================= 2026-07-28
def test_a_modern_request_carries_its_own_envelope() -> None:
    s = session()
    [serve] = s.receive(Request(1, "tools/call", modern_params(name="t", meta={META_LOG_LEVEL: "info"})))
    assert isinstance(serve, Serve)
    assert serve.era == "modern" and serve.protocol_version == LATEST_MODERN
    assert serve.client_capabilities == {"elicitation": {}} and serve.log_level == "info"
    assert s.client_capabilities == {}  # nothing is kept for the connection


@pytest.mark.parametrize("meta, code", [
    ({META_PROTOCOL_VERSION: "1999-01-01", META_CLIENT_CAPABILITIES: {}}, UNSUPPORTED_PROTOCOL_VERSION),
    ({META_PROTOCOL_VERSION: LATEST_MODERN}, INVALID_PARAMS),
    ({}, INVALID_PARAMS),
])
def test_a_bad_envelope_is_answered_at_once(meta: dict[str, Any], code: int) -> None:
    s = ServerSession(server_info=SERVER_INFO, era="modern")
    [send] = s.receive(Request(1, "tools/list", {"_meta": meta}))
    assert isinstance(send, Send) and send.message.error["code"] == code
    assert s.in_flight() == frozenset()


def test_discover_is_answered_with_the_versions_and_private_cache_hints() -> None:
    s = session()
    [discover] = s.receive(Request(1, "server/discover", modern_params()))
    assert isinstance(discover, Discover)
    result = s.discover_result(discover.request, CAPS, "hello").result
    assert result["supportedVersions"] == [LATEST_MODERN] and result["capabilities"] == CAPS
    assert result["instructions"] == "hello" and result["resultType"] == "complete"
    assert result["cacheScope"] == "private" and result["ttlMs"] == 0
    assert result["_meta"][META_SERVER_INFO] == SERVER_INFO


def test_modern_results_get_a_result_type_and_server_info_and_lists_are_private() -> None:
    s = session()
    s.receive(Request(1, "tools/list", modern_params()))
    listed = s.result(1, "tools/list", {"tools": [], "ttlMs": 5000}).result
    assert listed["cacheScope"] == "private" and listed["ttlMs"] == 5000
    called = s.result(2, "tools/call", {"content": [], "resultType": "input_required"}).result
    assert called["resultType"] == "input_required" and "cacheScope" not in called


def test_listen_agrees_only_to_what_the_gateway_has_and_routes_by_stream() -> None:
    s = session()
    wanted = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True,
              "resourceSubscriptions": ["a://1", 7]}
    [listen] = s.receive(Request("L", "subscriptions/listen", modern_params(notifications=wanted)))
    assert isinstance(listen, Listen)
    agreed, ack = s.listen_opened(listen, {"tools": {}, "resources": {}})
    assert agreed == {"toolsListChanged": True, "resourcesListChanged": True, "resourceSubscriptions": ["a://1"]}
    assert ack.params == {"notifications": agreed, "_meta": {META_SUBSCRIPTION_ID: "L"}}
    assert s.list_changed("notifications/tools/list_changed") == [
        Notification("notifications/tools/list_changed", {"_meta": {META_SUBSCRIPTION_ID: "L"}})]
    assert s.list_changed("notifications/prompts/list_changed") == []
    assert s.wants("notifications/tools/list_changed") and not s.wants("notifications/prompts/list_changed")
    assert s.resource_updated({"uri": "a://1"})[0].params == {"uri": "a://1", "_meta": {META_SUBSCRIPTION_ID: "L"}}
    assert s.resource_updated({"uri": "a://2"}) == []
    # The server's own _meta (a sequence of its own, say) goes on; only the subscription id is Bastion's.
    assert s.resource_updated({"uri": "a://1", "_meta": {"seq": 7, META_SUBSCRIPTION_ID: "forged"}})[0].params == {
        "uri": "a://1", "_meta": {"seq": 7, META_SUBSCRIPTION_ID: "L"}}
    # Cancelling the stream ends what it carried.
    assert s.receive(Notification("notifications/cancelled", {"requestId": "L"})) == [Cancel("L")]
    assert s.list_changed("notifications/tools/list_changed") == []


def test_a_listen_cancelled_before_it_opened_carries_nothing() -> None:
    s = session()
    [listen] = s.receive(Request("L", "subscriptions/listen", modern_params(notifications={"toolsListChanged": True})))
    s.request_done("L")
    s.listen_opened(listen, CAPS)
    assert s.list_changed("notifications/tools/list_changed") == []


def test_modern_logs_go_only_while_a_request_asks_for_them() -> None:
    s = session()
    assert s.log_message({"level": "error"}) == [] and not s.wants("logs")
    s.receive(Request(1, "tools/call", modern_params(meta={META_LOG_LEVEL: "warning"})))
    assert s.wants("logs")
    assert s.log_message({"level": "info"}) == []
    assert s.log_message({"level": "warning"}) == [Notification("notifications/message", {"level": "warning"})]
    s.request_done(1)
    assert s.log_message({"level": "emergency"}) == []


def test_a_modern_client_is_never_told_of_lists_without_a_listen() -> None:
    s = session()
    s.receive(Request(1, "tools/list", modern_params()))
    assert s.list_changed("notifications/tools/list_changed") == []
    assert not s.wants("notifications/tools/list_changed")


# ======================================================================================= properties
@PROPERTY
@given(st.lists(JSON_OBJECTS | st.binary(max_size=30), max_size=12))
def test_no_frame_sequence_raises_and_every_error_reply_is_an_error_response(frames: list[Any]) -> None:
    s = session()
    for item in frames:
        for event in s.receive_frame(item if isinstance(item, bytes) else frame(item)):
            if isinstance(event, Send):
                assert isinstance(event.message, ErrorResponse)


@PROPERTY
@given(st.lists(JSON_OBJECTS | st.sampled_from([
    frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE.params}),
    frame({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    frame({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    frame({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "t", "arguments": {"a": 1}}}),
    frame({"jsonrpc": "2.0", "id": "x", "method": "ping", "params": []})]), max_size=12))
def test_a_frame_the_transport_decoded_is_taken_as_the_session_would_read_it(values: list[Any]) -> None:
    """An HTTP body is decoded once, by the frontend; the session takes that value and answers exactly as it
    answers the same bytes, over the size limit included."""
    read, handed = session(), session()
    for value in values:
        data = value if isinstance(value, bytes) else frame(value)
        decoded = orjson.loads(data)
        if not isinstance(decoded, dict):
            continue  # the frontend refuses anything but an object before the session
        assert handed.receive_frame(data, decoded) == read.receive_frame(data)
    oversized = frame({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "x" * 10_000}})
    assert handed.receive_frame(oversized, orjson.loads(oversized)) == read.receive_frame(oversized)


MESSAGES = st.one_of(
    st.builds(Request, REQUEST_IDS, st.sampled_from(["initialize", "ping", "tools/call", "tools/list",
                                                    "logging/setLevel", "server/discover", "subscriptions/listen"]),
              st.one_of(st.none(), st.just({"level": "info"}), st.just(INITIALIZE.params), st.just(modern_params()))),
    st.builds(Notification, st.sampled_from(["notifications/initialized", "notifications/cancelled",
                                             "notifications/roots/list_changed"]),
              st.one_of(st.none(), st.builds(lambda i: {"requestId": i}, REQUEST_IDS))),
    st.builds(Response, REQUEST_IDS, st.just({})),
)


@PROPERTY
@given(st.lists(MESSAGES, max_size=20), st.booleans())
def test_every_request_is_served_or_answered_never_both_and_ids_in_flight_are_unique(messages: list[Any],
                                                                                     finish: bool) -> None:
    s = session()
    for message in messages:
        before = s.in_flight()
        events = s.receive(message)
        served = [e for e in events if isinstance(e, (Serve, Initialize, Discover, Listen))]
        replies = [e for e in events if isinstance(e, Send)]
        assert len(served) <= 1
        if isinstance(message, Request):
            assert not (served and replies)
            if served:
                assert message.id not in before and message.id in s.in_flight()
            elif message.id in before and s.lifecycle.state is not State.SHUTDOWN:
                assert replies  # refused, by the lifecycle or for the id in flight
        if isinstance(message, Notification):
            assert not replies  # a notification is never answered
        if s.lifecycle.state is State.SHUTDOWN and s.era == "legacy":
            assert not served
        for event in served:
            if isinstance(event, Initialize):
                s.initialize_result(event.request, {}, None)
            if finish:
                s.request_done(event.request.id)
        if s.era == "legacy" and s.lifecycle.state is not State.ACTIVE:
            assert s.list_changed("notifications/tools/list_changed") == []


@PROPERTY
@given(JSON_OBJECTS)
def test_a_legacy_result_never_keeps_a_modern_field_and_keeps_everything_else(result: dict[str, Any]) -> None:
    meta = {META_SERVER_INFO: {}, "own": 1}
    out = legacy_result({**result, "resultType": "complete", "_meta": meta})
    assert "resultType" not in out and out["_meta"] == {"own": 1}
    assert {k: v for k, v in out.items() if k != "_meta"} == {k: v for k, v in result.items()
                                                             if k not in ("_meta", "resultType")}


@PROPERTY
@given(st.sampled_from(LOG_LEVELS), st.sampled_from(LOG_LEVELS))
def test_log_level_order(level: str, threshold: str) -> None:
    assert at_least(level, threshold) == (LOG_LEVELS.index(level) >= LOG_LEVELS.index(threshold))


def test_a_listen_naming_more_resources_than_the_bound_is_refused_and_holds_no_id() -> None:
    s = session()
    too_many = {"resourceSubscriptions": [f"a://{n}" for n in range(MAX_SUBSCRIPTIONS + 1)]}
    [refused] = s.receive(Request("L", "subscriptions/listen", modern_params(notifications=too_many)))
    assert isinstance(refused, Send) and refused.message.error["code"] == -32602
    assert str(MAX_SUBSCRIPTIONS) in refused.message.error["message"]
    # the id was never taken: the same id may open a listen within the bound
    repeated = {"resourceSubscriptions": ["a://1"] * (MAX_SUBSCRIPTIONS)}
    [listen] = s.receive(Request("L", "subscriptions/listen", modern_params(notifications=repeated)))
    agreed, _ = s.listen_opened(listen, CAPS)
    assert agreed["resourceSubscriptions"] == ["a://1"]  # said once however often it was named
