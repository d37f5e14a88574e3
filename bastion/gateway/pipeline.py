"""The one interceptor chain every message passes, both ways, compiled per route.

A message is resolved once where it enters (``bastion.model.GatewayRequest``: direction, kind, method, session,
server, target). An interceptor is a callable ``(message, call_next)`` that sees every message of every kind, or an
object with hooks by kind (``on_request``, ``on_notification``) that sees every message of the kinds it has hooks
for; either way in both directions, unless it narrows itself with ``methods`` (the only methods it looks at) or
``directions``. That is the rule a guard cannot get wrong: a hook that declares no filter sees every message of its
kind. A request's answer, result or error, comes back through the same interceptors.

The chain is compiled once per route, ``(direction, kind, method)``, as Envoy compiles a filter chain per route: an
interceptor that declares the route is not its own is not on that route's path at all, and what may stay the bytes
it came in (``passes_raw``) is decided there. The last step of a client's request routes it to its server; the last
step of every other message hands it to ``message.deliver`` (ask or tell the client, do what a client's
notification says, or answer a server's request Bastion answers itself: its ping, a method relayed to no client).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Sequence

from bastion.model import (
    NOTIFICATION, REQUEST, TO_SERVER, GatewayError, GatewayRequest, Handler, Interceptor,
)

log = logging.getLogger("bastion.gateway")

Hook = Callable[[GatewayRequest, Handler], Awaitable[Any]]
# A client's requests the client session answers itself (the handshake, discovery, a listen stream): they pass the
# chain like any other, and its last step hands them back to the session (``message.deliver``) instead of a server.
ANSWERED_BY_SESSION = frozenset({"initialize", "server/discover", "subscriptions/listen"})
_HOOKS = {REQUEST: "on_request", NOTIFICATION: "on_notification"}


def hook_for(interceptor: Interceptor, direction: str, kind: str, method: str) -> Hook | None:
    """What of ``interceptor`` takes a message of this route, or None when it declares the route not its own."""
    methods = getattr(interceptor, "methods", None)
    if methods is not None and method not in methods:
        return None
    directions = getattr(interceptor, "directions", None)
    if directions is not None and direction not in directions:
        return None
    named = getattr(interceptor, _HOOKS[kind], None)
    if named is not None:
        return named  # type: ignore[no-any-return]
    if any(hasattr(interceptor, hook) for hook in _HOOKS.values()):
        return None  # it has hooks, and none for this kind
    return interceptor


def deliver(message: GatewayRequest) -> Awaitable[Any]:
    """The last step of every message but a client's request: hand it where it was going."""
    return message.deliver(message)  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class Route:
    """The chain of one ``(direction, kind, method)``: its handler, and whether anything reads the message."""

    handle: Handler
    hooks: tuple[Hook, ...]
    raw_params: bool  # nothing on it reads the params: they may stay the bytes they came in
    raw_results: bool  # nothing on it reads the result (or only as the server's bytes too)
    # The handler that takes a message at each position of the whole chain (the next interceptor on this route from
    # there on): where a message an interceptor passes on under another method goes on.
    entry_at: tuple[Handler, ...]

    @property
    def empty(self) -> bool:
        return not self.hooks


class Chain:
    """The interceptors, outermost first, compiled per route on first use."""

    def __init__(self, interceptors: Sequence[Interceptor], route_request: Callable[[bool], Handler],
                 observer: Observer | None = None) -> None:
        """``route_request(raw_results)`` is the last step of a client's request (the gateway's router);
        ``observer`` (tracing, JSON logs' request facts) wraps a client request's route and each of its steps."""
        self.interceptors = tuple(interceptors)
        self._route_request = route_request
        self._observer = observer
        self._routes: dict[tuple[str, str, str], Route] = {}

    def route(self, direction: str, kind: str, method: str) -> Route:
        key = (direction, kind, method)
        found = self._routes.get(key)
        if found is None:
            found = self._routes[key] = self._compile(direction, kind, method)
        return found

    def handle(self, message: GatewayRequest) -> Awaitable[Any]:
        """Pass ``message`` through its route (a plain function handing back the first step's coroutine)."""
        return self.route(message.direction, message.kind, message.method).handle(message)

    def _compile(self, direction: str, kind: str, method: str) -> Route:
        count = len(self.interceptors)
        hooks = [hook_for(interceptor, direction, kind, method) for interceptor in self.interceptors]
        readers = [i for i, hook in zip(self.interceptors, hooks) if hook is not None]
        observer = self._observer if (direction, kind) == (TO_SERVER, REQUEST) else None
        if observer is not None:
            # Decided here, once per route: a gateway without an observer compiles exactly the route it always did.
            readers.append(observer)
            hooks = [None if hook is None else observer.step(interceptor, hook)
                     for interceptor, hook in zip(self.interceptors, hooks)]
        raw_params = not any(_reads(i, "params") for i in readers)
        raw_results = not any(_reads(i, "results") for i in readers)
        routed = (direction, kind) == (TO_SERVER, REQUEST) and method not in ANSWERED_BY_SESSION
        terminal = self._route_request(raw_results) if routed else deliver
        # entry_at[p] takes a message at position p: the next interceptor on this route from p on (its hook, handed
        # what follows it), each position with its own step, so that a message passed on there under another method
        # goes on along that method's route from p, missing none of the interceptors between.
        entry_at: list[Handler] = [terminal] * (count + 1)
        entry_at[count] = self._step(None, terminal, direction, kind, method, count)
        following: tuple[Hook | None, Handler] = (None, terminal)
        for position in range(count - 1, -1, -1):
            hook = hooks[position]
            if hook is not None:
                following = (hook, entry_at[position + 1])
            entry_at[position] = self._step(*following, direction, kind, method, position)
        handle = entry_at[0] if observer is None else observer.request(entry_at[0], method)
        return Route(handle, tuple(hook for hook in hooks if hook is not None), raw_params, raw_results,
                     tuple(entry_at))

    def _step(self, hook: Hook | None, call_next: Handler, direction: str, kind: str, method: str,
              position: int) -> Handler:
        """One step of this route: ``hook`` with ``call_next`` (or, with no hook, ``call_next`` alone). A message an
        interceptor passes on under another method (the search exposure lists tools on a call's way) goes on along
        that method's route, from the same position. A plain function handing back the interceptor's own coroutine:
        a layer of its own would be one more coroutine to create and resume per interceptor per message."""
        if hook is None:
            def handle(message: GatewayRequest) -> Awaitable[Any]:
                if message.method == method:
                    return call_next(message)
                return self.route(direction, kind, message.method).entry_at[position](message)
        else:
            def handle(message: GatewayRequest) -> Awaitable[Any]:
                if message.method == method:
                    return hook(message, call_next)
                return self.route(direction, kind, message.method).entry_at[position](message)

        return handle


class Observer(Protocol):
    """What watches a client's requests on their way (``bastion.observability``): on the routes of a client's
    requests only, it wraps the first step (``request``) and each interceptor's hook (``step``), and declares what
    it reads (``reads_params``, ``reads_results``) as an interceptor does."""

    reads_params: bool
    reads_results: bool

    def request(self, handle: Handler, method: str) -> Handler: ...

    def step(self, interceptor: Interceptor, hook: Hook) -> Hook: ...


class InOrder:
    """Notifications of one sender that have interceptors on their route: each passes the chain in a task of its own,
    one after another, so they keep the sender's order however long an interceptor takes. A notification has no reply
    to carry a refusal: one an interceptor refuses is dropped, and said in the log."""

    def __init__(self, sender: str) -> None:
        self._sender = sender  # for the log: "server fx", "the client"
        self._tail: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    def pass_on(self, handle: Handler, message: GatewayRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._pass(self._tail, handle, message))
        self._tail = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def pending(self) -> "asyncio.Task[None] | None":
        """The last one still passing the chain (the others are before it), None when none is."""
        tail = self._tail
        return tail if tail is not None and not tail.done() else None

    def close(self) -> None:
        for task in list(self._running):
            task.cancel()

    async def _pass(self, previous: "asyncio.Task[None] | None", handle: Handler, message: GatewayRequest) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            await handle(message)
        except Exception as exc:  # noqa: BLE001 - one refused or failing notification must not stop the next
            reason = exc.message if isinstance(exc, GatewayError) else repr(exc)
            log.info("%s: %s not passed on: %s", message.server and f"server {message.server}" or self._sender,
                     message.method, reason)


def build_pipeline(interceptors: Sequence[Interceptor], terminal: Handler) -> Handler:
    """Chain ``interceptors`` around ``terminal`` for whatever message is passed (each interceptor's hook chosen by
    the message's route, as the gateway's chain does); for tools and tests that run a chain of their own."""

    def handle_from(index: int) -> Handler:
        def handle(message: GatewayRequest) -> Awaitable[Any]:
            for position in range(index, len(interceptors)):
                hook = hook_for(interceptors[position], message.direction, message.kind, message.method)
                if hook is not None:
                    return hook(message, handle_from(position + 1))
            return terminal(message)

        return handle

    return handle_from(0)


def passes_raw(interceptors: Sequence[Interceptor], method: str, part: str) -> bool:
    """Whether ``part`` (``"params"`` or ``"results"``) of a client's ``method`` requests may stay the JSON bytes
    they came in through this chain: what the chain compiled for that route says (``Route.raw_params``,
    ``Route.raw_results``)."""
    route = Chain(interceptors, lambda raw_results: deliver).route(TO_SERVER, REQUEST, method)
    return route.raw_params if part == "params" else route.raw_results


def _reads(interceptor: Interceptor, part: str) -> bool:
    return getattr(interceptor, f"reads_{part}", True) not in (False, "raw")
