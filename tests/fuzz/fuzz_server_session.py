"""One client's session (``ServerSession``) fed a random sequence of frames, with the driver's side acted out:
requests handed over are sometimes finished, the connection sometimes lost, Bastion's own requests sometimes sent.

Oracle: the session never raises; every request it reads is answered once or handed to the driver once (never
both, never twice), unless the session closes the connection; an id is never handed over while the driver still
serves the same id; errors carry the request's id; after ``CloseConnection`` the driver stops reading."""

from __future__ import annotations

from typing import Any

import atheris
import orjson

from bastion.protocol import server_session as ss
from bastion.protocol.jsonrpc import ErrorResponse, Request, Response, is_valid_id, parse_frame
from tests.fuzz.common import json_value

HANDED = (ss.Initialize, ss.Serve, ss.Discover, ss.Listen)
METHODS = ["initialize", "notifications/initialized", "notifications/cancelled", "tools/call", "tools/list",
           "server/discover", "subscriptions/listen", "logging/setLevel", "ping", "notifications/roots/list_changed"]
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}, "io.modelcontextprotocol/clientInfo": {"name": "c"}}


def _frame(fdp: atheris.FuzzedDataProvider, ids: list[Any], outgoing: list[str]) -> bytes:
    kind = fdp.ConsumeIntInRange(0, 7)
    if kind == 0:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    if kind == 1:
        return orjson.dumps(json_value(fdp))
    message: dict[str, Any] = {"jsonrpc": "2.0"}
    if kind in (2, 3, 4):  # a request or a notification
        message["method"] = fdp.PickValueInList(METHODS)
        if kind != 4:
            message["id"] = fdp.PickValueInList(ids) if fdp.ConsumeBool() else json_value(fdp)
        params = json_value(fdp) if fdp.ConsumeIntInRange(0, 3) == 0 else {}
        if isinstance(params, dict):
            if fdp.ConsumeBool():
                params["_meta"] = dict(MODERN_META)
            if message["method"] == "notifications/cancelled":
                params["requestId"] = fdp.PickValueInList(ids) if fdp.ConsumeBool() else json_value(fdp)
            if message["method"] == "logging/setLevel":
                params["level"] = json_value(fdp)
            if message["method"] == "subscriptions/listen":
                params["notifications"] = json_value(fdp)
        message["params"] = params
    else:  # a response, maybe to one of Bastion's own requests
        message["id"] = fdp.PickValueInList(outgoing) if outgoing and fdp.ConsumeBool() else json_value(fdp)
        if kind == 5:
            message["result"] = json_value(fdp)
        else:
            message["error"] = {"code": -1, "message": "no"} if fdp.ConsumeBool() else json_value(fdp)
    if fdp.ConsumeIntInRange(0, 7) == 0:
        message[fdp.PickValueInList(["jsonrpc", "id", "method", "params"])] = json_value(fdp)
    return orjson.dumps(message)


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    session = ss.ServerSession(server_info={"name": "bastion"}, max_message_bytes=fdp.ConsumeIntInRange(16, 4096),
                               era=fdp.PickValueInList([None, None, "legacy", "modern"]))
    serving: set[Any] = set()  # ids handed over and not yet finished, as the driver knows them
    ids: list[Any] = [1, 2, "a"]
    outgoing: list[str] = []
    for _ in range(fdp.ConsumeIntInRange(1, 24)):
        step = fdp.ConsumeIntInRange(0, 9)
        if step == 0 and serving:
            done = sorted(serving, key=repr)[fdp.ConsumeIntInRange(0, len(serving) - 1)]
            serving.discard(done)
            session.request_done(done)
            continue
        if step == 1:
            outgoing.append(session.outgoing_request("sampling/createMessage", {}).id)
            continue
        if step == 2 and session.era is not None:
            session.result(1, "tools/list", {"tools": []})
            session.list_changed("notifications/tools/list_changed")
            session.log_message({"level": json_value(fdp), "data": "x"})
            continue
        frame = _frame(fdp, ids, outgoing)
        events = session.receive_frame(frame)
        assert all(type(e) in ss.Event.__args__ for e in events), events
        if any(type(e) is ss.CloseConnection for e in events):
            return
        read = parse_frame(frame, session.max_message_bytes)
        handed = [e for e in events if type(e) in HANDED]
        answers = [e for e in events if type(e) is ss.Send and type(e.message) in (Response, ErrorResponse)]
        if type(read) is Request:
            assert len(handed) + len(answers) == 1, (frame, events)
            for event in handed:
                assert event.request.id == read.id and read.id not in serving, (frame, serving)
                serving.add(read.id)
                if type(event) is ss.Listen and fdp.ConsumeBool():
                    session.listen_opened(event, {"tools": {}})
            for event in answers:
                assert event.message.id == read.id, (frame, events)
        else:
            assert not handed, (frame, events)
            assert len(answers) <= 1, (frame, events)
        for event in events:
            if type(event) is ss.Cancel:
                assert is_valid_id(event.request_id) and event.request_id in session.in_flight(), events
    session.connection_lost()
