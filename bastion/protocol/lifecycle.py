"""The legacy (handshake era) connection lifecycle as a state machine.

    UNINITIALIZED --initialize--> INITIALIZING --notifications/initialized--> ACTIVE --close/drop--> SHUTDOWN

``ServerLifecycle`` is the side that receives ``initialize`` (Bastion's frontend); ``ClientLifecycle`` the side
that sends it (Bastion's upstream connections). Each event returns a ``Verdict`` telling the caller what to do;
the machines themselves perform no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from bastion.protocol.jsonrpc import INVALID_REQUEST, ErrorResponse, Message, Notification, Request, Response, error


class State(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    ACTIVE = "active"
    SHUTDOWN = "shutdown"


class Action(enum.Enum):
    ACCEPT = "accept"  # process the message
    REJECT = "reject"  # answer with ``reply``, keep the connection
    REJECT_AND_CLOSE = "reject_and_close"  # answer with ``reply``, then close the transport
    IGNORE = "ignore"  # discard silently
    ABORT = "abort"  # abort running calls and release resources


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    reply: ErrorResponse | None = None


_ACCEPT = Verdict(Action.ACCEPT)
_IGNORE = Verdict(Action.IGNORE)
_ABORT = Verdict(Action.ABORT)

# Allowed in either direction before the handshake completes, as the specification permits.
_PRE_HANDSHAKE_METHODS = frozenset({"ping"})


def _reject(message: Message, reason: str, close: bool) -> Verdict:
    reply = None
    if isinstance(message, Request):
        reply = ErrorResponse(message.id, error(INVALID_REQUEST, reason))
    return Verdict(Action.REJECT_AND_CLOSE if close else Action.REJECT, reply)


def capabilities_problem(result: Mapping[str, Any]) -> str | None:
    """Why the capabilities in a server's initialize or server/discover result are unusable, or None."""
    if not isinstance(result.get("capabilities", {}), dict):
        return "the server's capabilities are not an object"
    return None


class ServerLifecycle:
    """The lifecycle as the server side sees it."""

    def __init__(self) -> None:
        self.state = State.UNINITIALIZED
        self.client_params: dict[str, Any] | None = None

    def receive(self, message: Message) -> Verdict:
        state = self.state
        method = getattr(message, "method", None)
        if state is State.ACTIVE:  # checked first: every message after the handshake comes this way
            if method == "initialize" and isinstance(message, Request):
                return _reject(message, "the connection is already initialized", close=False)
            return _ACCEPT
        if state is State.SHUTDOWN:
            return _IGNORE
        if state is State.UNINITIALIZED:
            if isinstance(message, Request) and method == "initialize":
                self.state = State.INITIALIZING
                self.client_params = message.params or {}
                return _ACCEPT
            if isinstance(message, Request) and method in _PRE_HANDSHAKE_METHODS:
                return _ACCEPT
            self.state = State.SHUTDOWN
            return _reject(message, "the connection is not initialized: send initialize first", close=True)
        # INITIALIZING
        if isinstance(message, Notification) and method == "notifications/initialized":
            self.state = State.ACTIVE
            return _ACCEPT
        if isinstance(message, Request) and method == "initialize":
            return _reject(message, "initialize was already received", close=False)
        if isinstance(message, Request) and method not in _PRE_HANDSHAKE_METHODS:
            return _reject(message, "the handshake is not complete: send notifications/initialized first", close=False)
        return _ACCEPT

    def transport_dropped(self) -> Verdict:
        was_live = self.state is not State.SHUTDOWN
        self.state = State.SHUTDOWN
        return _ABORT if was_live else _IGNORE

    def close(self) -> Verdict:
        return self.transport_dropped()


class ClientLifecycle:
    """The lifecycle as the client side sees it: it sends initialize and validates the answer."""

    def __init__(self, supported_versions: tuple[str, ...]) -> None:
        self.state = State.UNINITIALIZED
        self.supported_versions = supported_versions
        self.server_result: dict[str, Any] | None = None

    def start(self) -> None:
        """Called when ``initialize`` is sent."""
        if self.state is not State.UNINITIALIZED:
            raise RuntimeError(f"initialize sent in state {self.state.value}")
        self.state = State.INITIALIZING

    def initialize_answered(self, response: Response | ErrorResponse) -> str | None:
        """Validate the answer to ``initialize``; returns why it is unusable, or None when it is fine.

        The caller sends ``notifications/initialized`` and calls ``initialized_sent`` when this returns None,
        and closes the connection otherwise.
        """
        if self.state is not State.INITIALIZING:
            return f"initialize answered in state {self.state.value}"
        if isinstance(response, ErrorResponse):
            self.state = State.SHUTDOWN
            return f"initialize failed: {response.error.get('message')}"
        result = response.result
        version = result.get("protocolVersion")
        if version not in self.supported_versions:
            self.state = State.SHUTDOWN
            return f"the server answered with protocol version {version!r}, which Bastion does not speak"
        problem = capabilities_problem(result)
        if problem is not None:
            self.state = State.SHUTDOWN
            return problem
        self.server_result = result
        return None

    def initialized_sent(self) -> None:
        if self.state is State.INITIALIZING and self.server_result is not None:
            self.state = State.ACTIVE

    def may_send(self, method: str) -> bool:
        if self.state is State.ACTIVE:
            return True
        if self.state is State.UNINITIALIZED:
            return method in _PRE_HANDSHAKE_METHODS or method == "initialize"
        if self.state is State.INITIALIZING:
            return method in _PRE_HANDSHAKE_METHODS
        return False

    def transport_dropped(self) -> Verdict:
        was_live = self.state is not State.SHUTDOWN
        self.state = State.SHUTDOWN
        return _ABORT if was_live else _IGNORE
