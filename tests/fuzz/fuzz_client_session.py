"""Bastion's session with one server (``ClientSession`` and its ``Handshake``) fed what a server might send: random
frames, answers to the requests in flight (sometimes twice, sometimes late), oversize frames' edges, and answers to
each handshake step.

Oracle: nothing raises; every event is one of the documented kinds; a request in flight is answered at most once
and only by an answer with its id (a second answer, or one to an abandoned request, is ``Unmatched``); a handshake
ends in ``Ready`` or ``Failed`` within a few steps, and a ``Ready`` names an era and a version Bastion speaks."""

from __future__ import annotations

from typing import Any

import atheris
import orjson

from bastion.protocol import client_session as cs
from bastion.protocol.framing import EDGE, Oversize
from bastion.protocol.jsonrpc import ErrorResponse, Response, is_valid_id
from bastion.protocol.versions import LEGACY_VERSIONS, MODERN_VERSIONS
from tests.fuzz.common import json_value

EVENTS = (cs.Answered, cs.Unmatched, cs.ServerNotification, cs.ServerCancelled, cs.ServerRequest, cs.Garbage,
          cs.Ignored, cs.Dropped, cs.Unattributed)


def _answer_frame(fdp: atheris.FuzzedDataProvider, upstream_id: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": upstream_id}
    if fdp.ConsumeBool():
        message["result"] = json_value(fdp) if fdp.ConsumeIntInRange(0, 3) == 0 else {"content": []}
    else:
        message["error"] = {"code": fdp.ConsumeIntInRange(-32800, 0), "message": "x"}
    return orjson.dumps(message)


def _handshake(fdp: atheris.FuzzedDataProvider) -> None:
    handshake = cs.Handshake(fdp.PickValueInList(["auto", "legacy", "modern"]), {}, {"name": "bastion"})
    step = handshake.first()
    for _ in range(6):
        if type(step) is cs.Ready:
            assert step.facts.era in ("legacy", "modern")
            assert step.facts.protocol_version in (LEGACY_VERSIONS if step.facts.era == "legacy" else MODERN_VERSIONS)
            assert isinstance(step.facts.capabilities, dict), step.facts
            return
        if type(step) is cs.Failed:
            assert isinstance(step.reason, str)
            return
        assert type(step) is cs.Exchange, step
        if fdp.ConsumeIntInRange(0, 5) == 0:
            step = handshake.timed_out()
            continue
        result = json_value(fdp) if fdp.ConsumeBool() else {}
        if isinstance(result, dict) and fdp.ConsumeBool():
            result["supportedVersions" if step.method == "server/discover" else "protocolVersion"] = (
                [fdp.PickValueInList([*MODERN_VERSIONS, "x"])] if step.method == "server/discover"
                else fdp.PickValueInList([*LEGACY_VERSIONS, "x", 1]))
            result.setdefault("capabilities", json_value(fdp) if fdp.ConsumeBool() else {})
        if isinstance(result, dict) and fdp.ConsumeBool():
            step = handshake.answered(Response(1, result))
        else:
            data = ({"supported": [fdp.PickValueInList([*MODERN_VERSIONS, "x"])]} if fdp.ConsumeBool()
                    else json_value(fdp))
            step = handshake.answered(ErrorResponse(1, {"code": fdp.PickValueInList([-32022, -32601, 0]),
                                                        "message": "m", "data": data}))
    assert type(step) in (cs.Ready, cs.Failed), step


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    _handshake(fdp)
    session = cs.ClientSession("s", era=fdp.PickValueInList(["auto", "legacy", "modern"]), client_info={"name": "b"},
                               max_message_bytes=fdp.ConsumeIntInRange(8, 4096))
    live: dict[int, Any] = {}
    gone: set[int] = set()
    for _ in range(fdp.ConsumeIntInRange(1, 20)):
        step = fdp.ConsumeIntInRange(0, 7)
        if step == 0:
            pending, frame = session.begin("tools/call", {"_meta": {}, "name": "t"},
                                           progress_token=fdp.PickValueInList([None, 5, "p"]))
            assert frame.endswith(b"\n") and pending.upstream_id not in live
            live[pending.upstream_id] = pending
            continue
        if step == 1 and live:
            upstream_id = fdp.PickValueInList(sorted(live))
            session.abandon(live.pop(upstream_id), "gone")
            gone.add(upstream_id)
            continue
        if step == 2:
            session.listen_request({"toolsListChanged": fdp.ConsumeBool()}, [])
            continue
        if step == 3:
            head = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, EDGE))
            tail = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, EDGE))
            event = session.oversize(Oversize(fdp.ConsumeIntInRange(0, 10**9), 8, head, tail, fdp.ConsumeBool()))
        elif step in (4, 5):
            ids = sorted(live | dict.fromkeys(gone)) or [1]
            answered = fdp.PickValueInList(ids) if fdp.ConsumeBool() else json_value(fdp)
            event = session.receive(_answer_frame(fdp, answered))
        elif step == 6:
            if fdp.ConsumeBool():  # a server's own notification, a cancellation most of all
                event = session.receive(orjson.dumps({"jsonrpc": "2.0", "method": fdp.PickValueInList(
                    ["notifications/cancelled", "notifications/progress", "notifications/message"]),
                    "params": {"requestId": json_value(fdp), "progressToken": json_value(fdp)}}))
            else:
                event = session.receive(orjson.dumps(json_value(fdp)))
        else:
            event = session.receive(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80)))
        assert type(event) in EVENTS, event
        if type(event) is cs.Answered:
            upstream_id = event.pending.upstream_id
            assert upstream_id in live or upstream_id == session.listen_id or upstream_id not in gone, event
            live.pop(upstream_id, None)
            assert session.correlator.resolve(upstream_id) is None  # answered once: its entry is gone
        if type(event) is cs.ServerCancelled:
            assert is_valid_id(event.request_id), event  # what the gateway looks its relays up by
        if type(event) is cs.Dropped and event.reply is not None:
            assert event.reply.endswith(b"\n")
    session.drain()
