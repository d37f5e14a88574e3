"""The chain's rule, fed messages directly: an interceptor that declares nothing sees every message of every kind
both ways; one with hooks by kind sees every message of those kinds; ``methods`` and ``directions`` narrow it; the
chain is compiled once per route, and a message passed on under another method goes on along that method's route."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bastion.gateway.pipeline import ANSWERED_BY_SESSION, Chain, build_pipeline, passes_raw
from bastion.model import NOTIFICATION, REQUEST, TO_CLIENT, TO_SERVER, GatewayRequest, Identity, Session, ToolEntry

ROUTES = [(direction, kind, method) for direction in (TO_SERVER, TO_CLIENT) for kind in (REQUEST, NOTIFICATION)
          for method in ("tools/call", "tools/list", "sampling/createMessage", "notifications/progress",
                         "notifications/cancelled", "initialize")]


class Catalog:
    def __init__(self) -> None:
        self.lookups = 0

    def tool(self, name: str) -> ToolEntry | None:
        self.lookups += 1
        return ToolEntry(name, "fx", name.removeprefix("fx__"), {"name": name}) if name.startswith("fx__") else None

    def tools(self) -> list[ToolEntry]:
        return []


def message(direction: str, kind: str, method: str, params: dict | None = None, catalog: Any = None) -> GatewayRequest:
    async def delivered(passed: GatewayRequest) -> dict[str, Any]:
        return {"delivered": passed.method}

    return GatewayRequest(method, params or {}, Session(Identity("alice"), "legacy", "2025-11-25", {}),
                          catalog or Catalog(), direction=direction, kind=kind, deliver=delivered)


class Everything:
    """Declares nothing."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def __call__(self, message: GatewayRequest, call_next: Any) -> Any:
        self.seen.append((message.direction, message.kind, message.method))
        return await call_next(message)


class NotificationsOnly:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def on_notification(self, message: GatewayRequest, call_next: Any) -> Any:
        self.seen.append((message.direction, message.kind, message.method))
        return await call_next(message)


class ClientRequestsOnly:
    directions = frozenset({TO_SERVER})

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_request(self, message: GatewayRequest, call_next: Any) -> Any:
        self.seen.append(message.method)
        return await call_next(message)


def routed(raw_results: bool) -> Any:
    async def route(message: GatewayRequest) -> dict[str, Any]:
        return {"routed": message.method, "raw_results": raw_results}

    return route


@pytest.mark.parametrize("direction, kind, method", ROUTES)
async def test_an_interceptor_that_declares_nothing_sees_every_message(direction: str, kind: str, method: str) -> None:
    everything = Everything()
    chain = Chain([everything], routed)
    answer = await chain.handle(message(direction, kind, method))
    assert everything.seen == [(direction, kind, method)]
    if (direction, kind) == (TO_SERVER, REQUEST) and method not in ANSWERED_BY_SESSION:
        assert answer["routed"] == method
    else:
        assert answer == {"delivered": method}


@pytest.mark.parametrize("direction, kind, method", ROUTES)
async def test_hooks_by_kind_see_every_message_of_their_kind_both_ways(direction: str, kind: str, method: str) -> None:
    notifications, client_requests = NotificationsOnly(), ClientRequestsOnly()
    chain = Chain([notifications, client_requests], routed)
    await chain.handle(message(direction, kind, method))
    assert notifications.seen == ([(direction, kind, method)] if kind == NOTIFICATION else [])
    assert client_requests.seen == ([method] if (direction, kind) == (TO_SERVER, REQUEST) else [])
    route = chain.route(direction, kind, method)
    assert len(route.hooks) == (kind == NOTIFICATION) + ((direction, kind) == (TO_SERVER, REQUEST))


async def test_methods_narrow_and_a_route_without_interceptors_is_empty() -> None:
    class ProgressOnly(Everything):
        methods = frozenset({"notifications/progress"})

    progress = ProgressOnly()
    chain = Chain([progress], routed)
    assert chain.route(TO_CLIENT, NOTIFICATION, "notifications/message").empty
    assert not chain.route(TO_CLIENT, NOTIFICATION, "notifications/progress").empty
    assert not chain.route(TO_SERVER, NOTIFICATION, "notifications/progress").empty  # both ways
    assert chain.route(TO_CLIENT, NOTIFICATION, "notifications/message") is \
        chain.route(TO_CLIENT, NOTIFICATION, "notifications/message")  # compiled once


async def test_a_message_passed_on_under_another_method_follows_that_methods_route() -> None:
    class ListsOnCalls:
        methods = frozenset({"tools/call"})
        reads_results = False

        async def __call__(self, message: GatewayRequest, call_next: Any) -> Any:
            return await call_next(dataclasses.replace(message, method="tools/list", params={}))

    class ListWatcher(Everything):
        methods = frozenset({"tools/list"})

    watcher = ListWatcher()
    chain = Chain([ListsOnCalls(), watcher], routed)
    answer = await chain.handle(message(TO_SERVER, REQUEST, "tools/call", {"name": "fx__a"}))
    assert watcher.seen == [(TO_SERVER, REQUEST, "tools/list")]  # not on the call's route, yet it saw the list
    assert answer["routed"] == "tools/list"


async def test_raw_bytes_are_decided_per_route() -> None:
    class ReadsCallResultsRaw(Everything):
        methods = frozenset({"tools/call"})
        reads_params = False
        reads_results = "raw"

    class ReadsLists(Everything):
        methods = frozenset({"tools/list"})

    chain = Chain([ReadsCallResultsRaw(), ReadsLists()], routed)
    call = chain.route(TO_SERVER, REQUEST, "tools/call")
    assert call.raw_results and call.raw_params
    assert (await call.handle(message(TO_SERVER, REQUEST, "tools/call")))["raw_results"] is True
    assert not chain.route(TO_SERVER, REQUEST, "tools/list").raw_results
    assert passes_raw([ReadsCallResultsRaw()], "tools/call", "results")
    assert not passes_raw([Everything()], "tools/call", "results")


async def test_build_pipeline_chooses_hooks_per_message() -> None:
    notifications, everything = NotificationsOnly(), Everything()
    handle = build_pipeline([notifications, everything], routed(False))
    await handle(message(TO_CLIENT, NOTIFICATION, "notifications/progress"))
    await handle(message(TO_SERVER, REQUEST, "tools/call"))
    assert notifications.seen == [(TO_CLIENT, NOTIFICATION, "notifications/progress")]
    assert [m for _, _, m in everything.seen] == ["notifications/progress", "tools/call"]


def test_a_calls_tool_is_looked_up_once_per_name() -> None:
    catalog = Catalog()
    call = message(TO_SERVER, REQUEST, "tools/call", {"name": "fx__a"}, catalog)
    assert call.target is not None and call.target is call.target and catalog.lookups == 1
    call.params = {**call.params, "name": "fx__b"}  # an interceptor names another tool: judged on that one
    assert call.target is not None and call.target.original_name == "b" and catalog.lookups == 2
    renamed = dataclasses.replace(call, params={"name": "nothing"})
    assert renamed.target is None
