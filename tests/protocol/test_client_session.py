"""The upstream client session: handshake decisions for every era setting and answer, era stamping, correlation,
and the meaning of every kind of frame a server sends; properties over any order of answers, any params, any bytes."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.protocol.client_session import (
    PROBE_TIMEOUT,
    SELF,
    Answered,
    ClientSession,
    Dropped,
    Exchange,
    Failed,
    Garbage,
    Handshake,
    Ignored,
    Ready,
    ServerCancelled,
    ServerFacts,
    ServerNotification,
    ServerRequest,
    Unattributed,
    Unmatched,
)
from bastion.protocol.correlation import DuplicateRequestId
from bastion.protocol.framing import EDGE, Oversize
from bastion.protocol.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    ErrorResponse,
    RawResponse,
    Request,
    Response,
    error,
    raw_request_frame,
)
from bastion.protocol.versions import (
    LATEST_LEGACY,
    LATEST_MODERN,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    META_SERVER_INFO,
)
from tests.properties import JSON_OBJECTS, PROPERTY, REQUEST_IDS

INFO = {"name": "bastion", "version": "test"}
CAPS = {"sampling": {}}


def discover_result(versions=(LATEST_MODERN,), **extra):
    return {"supportedVersions": list(versions), "capabilities": {"tools": {"listChanged": True}}, **extra}


def initialize_result(version=LATEST_LEGACY, **extra):
    return {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "s"}, **extra}


def session(era="auto", **kw) -> ClientSession:
    return ClientSession("srv", era=era, client_info=INFO, client_capabilities=CAPS, max_message_bytes=1 << 20, **kw)


def frame(**message) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", **message})


# ------------------------------------------------------------------------------------------------ handshake
class TestHandshake:
    def test_auto_probes_discover_first_with_the_modern_envelope_and_a_bounded_wait(self):
        step = Handshake("auto", CAPS, INFO).first()
        assert isinstance(step, Exchange) and step.method == "server/discover"
        assert step.timeout == PROBE_TIMEOUT
        meta = step.params["_meta"]
        assert meta[META_PROTOCOL_VERSION] == LATEST_MODERN
        assert meta[META_CLIENT_CAPABILITIES] == CAPS and meta[META_CLIENT_INFO] == INFO

    def test_auto_with_a_modern_answer_is_ready_modern_with_the_servers_facts(self):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        answer = discover_result(instructions="use it", _meta={META_SERVER_INFO: {"name": "srv", "version": "1"}})
        step = handshake.answered(Response(1, answer))
        assert isinstance(step, Ready) and step.notify is None
        assert step.facts == ServerFacts("modern", LATEST_MODERN, {"tools": {"listChanged": True}},
                                         {"name": "srv", "version": "1"}, "use it")

    @pytest.mark.parametrize("answer", [
        ErrorResponse(1, error(-32601, "Method not found")),
        Response(1, {"supportedVersions": ["2099-01-01"]}),
        Response(1, {"supportedVersions": "2026-07-28"}),
        Response(1, {}),
    ], ids=["method-not-found", "unknown-versions", "versions-not-a-list", "empty-result"])
    def test_auto_falls_back_to_initialize_on_any_answer_that_is_not_modern(self, answer):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        step = handshake.answered(answer)
        assert isinstance(step, Exchange) and step.method == "initialize"
        assert step.params == {"protocolVersion": LATEST_LEGACY, "capabilities": CAPS, "clientInfo": INFO}
        assert step.timeout is None

    @pytest.mark.parametrize("era", ["auto", "modern"])
    def test_an_unsupported_version_error_listing_a_modern_version_is_probed_again_once(self, era):
        handshake = Handshake(era, CAPS, INFO)
        handshake.first()
        rejected = ErrorResponse(1, error(-32022, "Unsupported protocol version",
                                          {"supported": [LATEST_MODERN], "requested": LATEST_MODERN}))
        again = handshake.answered(rejected)
        assert isinstance(again, Exchange) and again.method == "server/discover"
        assert again.params["_meta"][META_PROTOCOL_VERSION] == LATEST_MODERN
        assert isinstance(handshake.answered(Response(2, discover_result())), Ready)

    def test_a_second_unsupported_version_error_is_not_probed_again(self):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        rejected = ErrorResponse(1, error(-32022, "Unsupported protocol version", {"supported": [LATEST_MODERN]}))
        handshake.answered(rejected)
        step = handshake.answered(rejected)
        assert isinstance(step, Exchange) and step.method == "initialize"

    @pytest.mark.parametrize("data", [None, {"supported": ["2099-01-01"]}, {"supported": LATEST_MODERN}, "x"],
                             ids=["no-data", "unknown-version", "not-a-list", "not-an-object"])
    def test_an_unsupported_version_error_without_a_modern_version_falls_back(self, data):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        step = handshake.answered(ErrorResponse(1, error(-32022, "Unsupported protocol version", data)))
        assert isinstance(step, Exchange) and step.method == "initialize"

    def test_auto_falls_back_to_initialize_when_the_probe_is_unanswered(self):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        step = handshake.timed_out()
        assert isinstance(step, Exchange) and step.method == "initialize"

    def test_legacy_initialize_answered_is_ready_with_initialized_to_send(self):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        handshake.timed_out()
        step = handshake.answered(Response(2, initialize_result(instructions="hi")))
        assert isinstance(step, Ready)
        assert step.notify is not None and step.notify.method == "notifications/initialized"
        assert step.facts == ServerFacts("legacy", LATEST_LEGACY, {"tools": {}}, {"name": "s"}, "hi")

    def test_configured_legacy_never_probes(self):
        step = Handshake("legacy", CAPS, INFO).first()
        assert isinstance(step, Exchange) and step.method == "initialize"

    def test_configured_modern_waits_for_the_probe_without_its_own_bound_and_never_falls_back(self):
        handshake = Handshake("modern", CAPS, INFO)
        step = handshake.first()
        assert isinstance(step, Exchange) and step.method == "server/discover" and step.timeout is None
        refused = handshake.answered(ErrorResponse(1, error(-32601, "nope")))
        assert refused == Failed("the server does not speak the 2026-07-28 protocol")

    def test_configured_modern_silent_fails(self):
        handshake = Handshake("modern", CAPS, INFO)
        handshake.first()
        assert isinstance(handshake.timed_out(), Failed)

    def test_modern_answer_with_capabilities_not_an_object_fails(self):
        handshake = Handshake("auto", CAPS, INFO)
        handshake.first()
        step = handshake.answered(Response(1, {"supportedVersions": [LATEST_MODERN], "capabilities": []}))
        assert step == Failed("the server's capabilities are not an object")

    @pytest.mark.parametrize("answer, said", [
        (ErrorResponse(2, error(-32603, "boom")), "initialize failed: boom"),
        (Response(2, initialize_result(version="1999-01-01")), "protocol version '1999-01-01'"),
        (Response(2, {"protocolVersion": LATEST_LEGACY, "capabilities": "all"}), "capabilities are not an object"),
    ])
    def test_unusable_initialize_answers_fail_saying_why(self, answer, said):
        handshake = Handshake("legacy", CAPS, INFO)
        handshake.first()
        step = handshake.answered(answer)
        assert isinstance(step, Failed) and said in step.reason

    def test_facts_of_wrong_types_are_dropped_not_kept(self):
        handshake = Handshake("legacy", CAPS, INFO)
        handshake.first()
        step = handshake.answered(Response(2, initialize_result(serverInfo="x", instructions=3)))
        assert isinstance(step, Ready)
        assert step.facts.server_info is None and step.facts.instructions is None

    def test_an_answer_when_nothing_is_awaited_fails(self):
        handshake = Handshake("legacy", CAPS, INFO)
        assert isinstance(handshake.answered(Response(1, {})), Failed)

    def test_unknown_era_is_refused(self):
        with pytest.raises(ValueError):
            Handshake("future", CAPS, INFO)

    def test_a_restarted_session_keeps_the_era_it_found(self):
        s = session()
        assert s.handshake().first().method == "server/discover"
        s.adopt(ServerFacts("legacy", LATEST_LEGACY, {}, None, None))
        assert s.handshake().first().method == "initialize"
        s.adopt(ServerFacts("modern", LATEST_MODERN, {}, None, None))
        assert s.handshake().first().timeout is None  # a modern server restarted must still be modern


# ------------------------------------------------------------------------------------------- era stamping
class TestStamping:
    def test_legacy_params_without_meta_pass_as_the_same_object(self):
        s = session("legacy")
        params = {"name": "t", "arguments": {}}
        assert s.outgoing_params(params) is params

    def test_legacy_strips_a_clients_modern_envelope_and_progress_token_but_keeps_other_meta(self):
        s = session("legacy")
        params = {"name": "t", "_meta": {META_PROTOCOL_VERSION: LATEST_MODERN, "progressToken": 7, "trace": "x"}}
        out = s.outgoing_params(params)
        assert out == {"name": "t", "_meta": {"trace": "x"}}
        assert params["_meta"]["progressToken"] == 7  # the caller's params are never changed

    def test_legacy_drops_an_envelope_left_empty(self):
        assert session("legacy").outgoing_params({"_meta": {META_PROTOCOL_VERSION: "x"}}) == {}

    def test_modern_stamps_bastions_envelope_with_the_requesting_clients_capabilities_and_log_level(self):
        s = session("modern")
        out = s.outgoing_params({"name": "t"}, log_level="debug", client_capabilities={"elicitation": {}})
        meta = out["_meta"]
        assert meta[META_PROTOCOL_VERSION] == LATEST_MODERN
        assert meta[META_CLIENT_CAPABILITIES] == {"elicitation": {}}
        assert meta[META_CLIENT_INFO] == INFO and meta[META_LOG_LEVEL] == "debug"

    def test_modern_falls_back_to_the_declared_capabilities(self):
        out = session("modern").outgoing_params(None)
        assert out["_meta"][META_CLIENT_CAPABILITIES] == CAPS

    def test_a_clients_forged_envelope_never_reaches_a_modern_server(self):
        forged = {"_meta": {META_CLIENT_INFO: {"name": "evil"}, META_PROTOCOL_VERSION: "1999"}}
        meta = session("modern").outgoing_params(forged)["_meta"]
        assert meta[META_CLIENT_INFO] == INFO and meta[META_PROTOCOL_VERSION] == LATEST_MODERN

    def test_progress_token_is_this_hops_id(self):
        s = session("legacy")
        params = s.outgoing_params({"name": "t", "_meta": {"progressToken": "client-token"}}, progress_token="client-token")
        pending, sent = s.begin("tools/call", params, origin="c1", origin_id=5, progress_token="client-token")
        message = orjson.loads(sent)
        assert message["id"] == pending.upstream_id
        assert message["params"]["_meta"]["progressToken"] == pending.upstream_id
        assert pending.origin_progress_token == "client-token"


# -------------------------------------------------------------------------------------------- correlation
class TestCorrelation:
    def test_requests_of_two_clients_with_the_same_id_get_distinct_ids_and_answers_find_them(self):
        s = session("legacy")
        a, fa = s.begin("tools/call", {}, origin="a", origin_id=1)
        b, fb = s.begin("tools/call", {}, origin="b", origin_id=1)
        assert a.upstream_id != b.upstream_id
        assert orjson.loads(fa)["id"] == a.upstream_id and orjson.loads(fb)["id"] == b.upstream_id
        event = s.receive(frame(id=b.upstream_id, result={"ok": True}))
        assert isinstance(event, Answered) and event.pending is b
        assert isinstance(event.message, RawResponse)
        assert len(s.correlator) == 1

    def test_an_origin_reusing_an_id_in_flight_is_refused(self):
        s = session("legacy")
        s.begin("tools/call", {}, origin="a", origin_id=1)
        with pytest.raises(DuplicateRequestId):
            s.begin("tools/call", {}, origin="a", origin_id=1)

    def test_bastions_own_requests_get_distinct_origin_ids(self):
        s = session("legacy")
        first, _ = s.begin("tools/list", None)
        second, _ = s.begin("tools/list", None)
        assert first.origin == SELF and first.origin_id != second.origin_id

    def test_a_frame_that_cannot_be_encoded_leaves_nothing_registered(self):
        s = session("legacy")

        def broken(*_):
            raise TypeError("not JSON")

        with pytest.raises(TypeError):
            s.begin("tools/call", {}, origin="a", origin_id=1, encode=broken)
        assert len(s.correlator) == 0
        s.begin("tools/call", {}, origin="a", origin_id=1)  # the id is free again

    def test_raw_encoder_is_used(self):
        s = session("legacy")
        _, sent = s.begin("tools/call", {"n": 1}, origin="a", origin_id=1, encode=raw_request_frame)
        assert orjson.loads(sent)["params"] == {"n": 1}

    def test_an_abandoned_request_is_cancelled_and_its_late_answer_expected(self):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="a", origin_id=1)
        cancel = orjson.loads(s.abandon(pending, "cancelled by the client"))
        assert cancel["method"] == "notifications/cancelled"
        assert cancel["params"] == {"requestId": pending.upstream_id, "reason": "cancelled by the client"}
        late = s.receive(frame(id=pending.upstream_id, result={}))
        assert late == Unmatched(pending.upstream_id, True)
        again = s.receive(frame(id=pending.upstream_id, result={}))  # only once: a second is suspicious
        assert again == Unmatched(pending.upstream_id, False)

    def test_unknown_answers_are_unexpected(self):
        assert session().receive(frame(id=999, result={})) == Unmatched(999, False)
        assert session().receive(frame(id="x", error={"code": 1, "message": "m"})) == Unmatched("x", False)

    def test_deadlines_are_passed_in_and_expired_requests_taken_out(self):
        s = session("legacy")
        soon, _ = s.begin("a", {}, origin="c", origin_id=1, deadline=10.0)
        s.begin("b", {}, origin="c", origin_id=2, deadline=20.0)
        s.begin("c", {}, origin="c", origin_id=3)
        assert s.expired(9.9) == []
        assert s.expired(10.0) == [soon]
        assert len(s.correlator) == 2
        assert s.receive(frame(id=soon.upstream_id, result={})) == Unmatched(soon.upstream_id, True)

    def test_drain_takes_every_request_for_the_error_each_is_owed(self):
        s = session("legacy")
        for n in range(3):
            s.begin("tools/call", {}, origin="c", origin_id=n)
        assert [p.origin_id for p in s.drain()] == [0, 1, 2]
        assert len(s.correlator) == 0

    def test_forget_frees_a_request_that_never_left(self):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=1)
        s.forget(pending)
        assert s.receive(frame(id=pending.upstream_id, result={})) == Unmatched(pending.upstream_id, False)


# ------------------------------------------------------------------------------------- what servers send
class TestReceive:
    def test_error_answers_are_answers(self):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=1)
        event = s.receive(frame(id=pending.upstream_id, error={"code": -32602, "message": "bad"}))
        assert isinstance(event, Answered) and isinstance(event.message, ErrorResponse)
        assert event.message.error["message"] == "bad"

    def test_progress_for_a_request_in_flight_names_it(self):
        s = session("legacy")
        params = s.outgoing_params({}, progress_token="t")
        pending, _ = s.begin("tools/call", params, origin="c", origin_id=1, progress_token="t")
        event = s.receive(frame(method="notifications/progress", params={"progressToken": pending.upstream_id,
                                                                          "progress": 1}))
        assert isinstance(event, ServerNotification) and event.pending is pending

    def test_progress_for_nothing_in_flight_is_ignored(self):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=1)  # asked no progress
        assert isinstance(s.receive(frame(method="notifications/progress",
                                          params={"progressToken": pending.upstream_id})), Ignored)
        assert isinstance(s.receive(frame(method="notifications/progress", params={"progressToken": True})), Ignored)

    def test_other_notifications_have_no_origin(self):
        event = session().receive(frame(method="notifications/tools/list_changed"))
        assert event == ServerNotification("notifications/tools/list_changed", {}, None)

    def test_the_servers_cancellation_of_its_own_request(self):
        assert session().receive(frame(method="notifications/cancelled", params={"requestId": 4})) == ServerCancelled(4)

    @pytest.mark.parametrize("request_id", [{"id": 4}, [4], True, 4.0, None])
    def test_a_servers_cancellation_naming_no_id_is_ignored(self, request_id):
        # Found by tests/fuzz/fuzz_client_session.py: the gateway looks the named relay up in a dict, where an object
        # raised TypeError and true or 4.0 cancelled the relay of request 1 or 4.
        event = session().receive(frame(method="notifications/cancelled", params={"requestId": request_id}))
        assert isinstance(event, Ignored)

    def test_a_ping_is_a_server_request_like_any_other(self):
        # The gateway answers it, after the interceptor chain: the session writes no answer of its own.
        event = session().receive(frame(id="p1", method="ping"))
        assert event == ServerRequest(Request("p1", "ping", None))

    def test_server_requests_go_to_the_gateway(self):
        event = session().receive(frame(id=3, method="sampling/createMessage", params={"messages": []}))
        assert isinstance(event, ServerRequest) and event.request.method == "sampling/createMessage"

    @pytest.mark.parametrize("bad", [b"not json", b"[1,2]", b'{"jsonrpc":"1.0","id":1,"result":{}}'])
    def test_garbage_says_why(self, bad):
        event = session().receive(bad)
        assert isinstance(event, Garbage) and event.frame == bad and event.reason

    @pytest.mark.parametrize("blank", [b"", b"  ", b"\t"])
    def test_blank_frames_are_ignored(self, blank):
        assert isinstance(session().receive(blank), Ignored)


# ------------------------------------------------------------------------- what servers send, too large to read
def too_large(message: dict, limit: int = 100, *, whole: bool = True) -> Oversize:
    """``message`` as the framer reports it when it is over ``limit``: its size, first and last bytes."""
    data = orjson.dumps(message)
    if not whole:
        data = data[:len(data) // 2]
    return Oversize(len(data), limit, data[:EDGE], data[-EDGE:], whole)


BIG = {"content": [{"type": "text", "text": "x" * 1000}]}


class TestOversize:
    @pytest.mark.parametrize("order", ["id first", "id last"])
    def test_an_answer_too_large_fails_the_request_it_answers_saying_so(self, order):
        s = session("legacy")
        other, _ = s.begin("tools/call", {}, origin="c", origin_id=1)
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=2)
        answer = ({"jsonrpc": "2.0", "id": pending.upstream_id, "result": BIG} if order == "id first" else
                  {"result": BIG, "jsonrpc": "2.0", "id": pending.upstream_id})
        frame_info = too_large(answer)
        event = s.oversize(frame_info)
        assert isinstance(event, Answered) and event.pending is pending
        assert isinstance(event.message, ErrorResponse) and event.message.error["code"] == INTERNAL_ERROR
        assert event.message.error["message"] == (
            f"server 'srv' answered tools/call with a message of {frame_info.size} bytes, over max_message_bytes "
            "(100); Bastion dropped it unread")
        assert s.correlator.find_by_origin("c", 1) is other and len(s.correlator) == 1  # the other waits on

    def test_an_error_answer_too_large_counts_too(self):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=1)
        event = s.oversize(too_large({"jsonrpc": "2.0", "id": pending.upstream_id,
                                      "error": {"code": 1, "message": "x" * 1000}}))
        assert isinstance(event, Answered) and event.pending is pending

    def test_a_late_answer_too_large_is_expected_and_dropped(self):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=1)
        s.abandon(pending, "timed out")
        assert s.oversize(too_large({"jsonrpc": "2.0", "id": pending.upstream_id, "result": BIG})) == \
            Unmatched(pending.upstream_id, True)

    def test_a_request_too_large_is_answered_with_an_error_and_a_notification_dropped(self):
        s = session("legacy")
        event = s.oversize(too_large({"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage",
                                      "params": {"messages": ["x" * 1000]}}))
        assert isinstance(event, Dropped) and event.what == "request sampling/createMessage"
        reply = orjson.loads(event.reply)
        assert reply["id"] == "s1" and reply["error"]["code"] == INVALID_REQUEST
        assert "over max_message_bytes (100)" in reply["error"]["message"]
        event = s.oversize(too_large({"jsonrpc": "2.0", "method": "notifications/message", "params": {"d": "x" * 999}}))
        assert event == Dropped("notification notifications/message", None)

    @pytest.mark.parametrize("shape", ["id between objects", "cut by the end of the stream", "not JSON"])
    def test_a_frame_too_large_whose_request_cannot_be_told_is_unattributed(self, shape):
        s = session("legacy")
        pending, _ = s.begin("tools/call", {}, origin="c", origin_id=1)
        if shape == "id between objects":
            frame_info = too_large({"jsonrpc": "2.0", "result": BIG, "id": pending.upstream_id, "_meta": {}})
        elif shape == "cut by the end of the stream":  # its last bytes are where it was cut, not its end
            frame_info = too_large({"result": BIG, "jsonrpc": "2.0", "id": pending.upstream_id}, whole=False)
        else:
            frame_info = Oversize(5000, 100, b"x" * EDGE, b"y" * EDGE)
        event = s.oversize(frame_info)
        assert isinstance(event, Unattributed)
        assert event.reason == (f"sent a message of {frame_info.size} bytes, over max_message_bytes (100), whose "
                                "request could not be told")
        assert len(s.correlator) == 1  # the caller decides: the session fails nothing by itself


# ----------------------------------------------------------------------------------------- listen stream
class TestListen:
    WANTED = {"toolsListChanged": True, "promptsListChanged": False, "resourcesListChanged": False}

    def test_opens_with_the_wanted_notifications_and_resources(self):
        s = session("modern")
        frames, wanted = s.listen_request(self.WANTED, ["file:///a"])
        assert wanted and len(frames) == 1
        message = orjson.loads(frames[0])
        assert message["method"] == "subscriptions/listen" and message["id"] == s.listen_id
        assert message["params"]["notifications"] == {**self.WANTED, "resourceSubscriptions": ["file:///a"]}
        assert message["params"]["_meta"][META_PROTOCOL_VERSION] == LATEST_MODERN

    def test_reopening_cancels_the_previous_stream(self):
        s = session("modern")
        s.listen_request(self.WANTED, [])
        first = s.listen_id
        frames, _ = s.listen_request(self.WANTED, ["file:///b"])
        assert [orjson.loads(f)["method"] for f in frames] == ["notifications/cancelled", "subscriptions/listen"]
        assert orjson.loads(frames[0])["params"] == {"requestId": first}
        assert s.listen_id != first and len(s.correlator) == 1

    def test_nothing_wanted_opens_nothing(self):
        s = session("modern")
        frames, wanted = s.listen_request({"toolsListChanged": False}, [])
        assert frames == [] and not wanted and s.listen_id is None

    def test_the_server_ending_its_stream_is_an_answer_to_nobody(self):
        s = session("modern")
        s.listen_request(self.WANTED, [])
        event = s.receive(frame(id=s.listen_id, result={}))
        assert isinstance(event, Answered) and event.pending.context is None
        assert s.listen_id is None


# ------------------------------------------------------------------------------------------------ properties
CALLS = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), REQUEST_IDS), max_size=30, unique=True)


@PROPERTY
@given(calls=CALLS, order=st.randoms(use_true_random=False))
def test_every_answer_in_any_order_reaches_the_request_it_answers_and_only_once(calls, order):
    s = session("legacy")
    sent = {}
    for origin, origin_id in calls:
        pending, frame_sent = s.begin("tools/call", {}, origin=origin, origin_id=origin_id)
        sent[orjson.loads(frame_sent)["id"]] = (origin, origin_id)
    assert len(sent) == len(calls)  # every request went out under an id of its own
    ids = list(sent)
    order.shuffle(ids)
    for upstream_id in ids:
        event = s.receive(frame(id=upstream_id, result={}))
        assert isinstance(event, Answered)
        assert (event.pending.origin, event.pending.origin_id) == sent[upstream_id]
        assert isinstance(s.receive(frame(id=upstream_id, result={})), Unmatched)
    assert len(s.correlator) == 0


@PROPERTY
@given(params=JSON_OBJECTS, meta=JSON_OBJECTS, era=st.sampled_from(["legacy", "modern"]))
def test_stamping_never_changes_the_callers_params_and_never_lets_a_clients_envelope_through(params, meta, era):
    s = session(era)
    given_params = {**params, "_meta": {**meta, META_CLIENT_INFO: {"name": "forged"}, "progressToken": "x"}}
    before = orjson.dumps(given_params)
    out = s.outgoing_params(given_params, log_level="info")
    assert orjson.dumps(given_params) == before
    out_meta = out.get("_meta", {})
    assert "progressToken" not in out_meta
    if era == "modern":
        assert out_meta[META_CLIENT_INFO] == INFO and out_meta[META_PROTOCOL_VERSION] == LATEST_MODERN
    else:
        assert not any(key.startswith("io.modelcontextprotocol/") for key in out_meta)
    assert {k: v for k, v in out.items() if k != "_meta"} == {k: v for k, v in params.items() if k != "_meta"}


@PROPERTY
@given(data=st.binary(max_size=200))
def test_any_bytes_are_read_into_an_event_never_an_exception(data):
    s = session()
    s.begin("tools/call", {}, origin="a", origin_id=1)
    event = s.receive(data)
    assert isinstance(event, (Answered, Unmatched, ServerNotification, ServerCancelled, ServerRequest, Garbage,
                              Ignored))


# Bytes, and runs of what JSON-RPC messages are made of, so the readers of both ends get far.
TOKENS = list('{}[]":,\\ \t-.e01279') + ['"id"', '"result"', '"error"', '"method"', '"jsonrpc"', '"2.0"', "true",
                                           "null", '"x\\"']
EDGES = st.binary(max_size=EDGE) | st.lists(st.sampled_from(TOKENS), max_size=40).map(
    lambda tokens: "".join(tokens).encode()[-EDGE:])


@PROPERTY
@given(head=EDGES, tail=EDGES, whole=st.booleans())
def test_any_ends_of_a_frame_too_large_are_read_into_an_event_never_an_exception(head, tail, whole):
    s = session()
    s.begin("tools/call", {}, origin="a", origin_id=1)
    event = s.oversize(Oversize(10_000, 100, head, tail, whole))
    assert isinstance(event, (Answered, Unmatched, Dropped, Unattributed))
