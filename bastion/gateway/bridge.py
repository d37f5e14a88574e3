"""Input a handshake-era server asks for in the middle of a 2026-07-28 client's call, bridged across the eras.

A handshake-era server asks the client with a request of its own (``sampling/createMessage``,
``elicitation/create``, ``roots/list``) while the call that needs it waits. A 2026-07-28 client is asked by the
answer to its call instead: an ``input_required`` result naming what is needed, after which it sends the call
again with ``inputResponses`` and the ``requestState`` it was given. Between the two, the call stays where it
is: its handling (a Task running the gateway's pipeline, with the server's request waiting inside it) is
parked here under that state, until the client's retry brings the answers, the call ends, or the wait for the
retry runs out.

The state is a random token bound to the identity that made the call: only that identity's retry resumes it,
on whatever connection it comes (a 2026-07-28 HTTP client sends each request on its own).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping

from bastion.model import GatewayError, Identity
from bastion.protocol import jsonrpc

PARKED_FOR = 300.0  # how long a call waits for the retry that answers its input_required, in seconds
TOKEN_PREFIX = "bastion-input:"  # a requestState of Bastion's own, told apart from a modern server's


@dataclass(eq=False, slots=True)
class BridgedCall:
    """One 2026-07-28 client's call in flight, its handling and the questions its server has asked."""

    identity: Identity
    client_capabilities: Mapping[str, Any]
    handling: asyncio.Task[Any]
    origin: tuple[Hashable, Any]  # (connection id, the client's request id) the servers know the call by
    # Drawn when the call is parked: most calls end without asking, and need no random draw.
    token: str | None = None
    # Done when a question arrives while the client's request waits (or at once, if one is open already).
    attention: asyncio.Future[None] | None = None
    questions: dict[str, tuple[str, dict[str, Any], asyncio.Future[dict[str, Any]]]] = field(default_factory=dict)
    parked: bool = False  # its input_required went out: the handling outlives the request that started it
    expiry: asyncio.TimerHandle | None = None
    # What the call is (its method, and the tool, prompt or resource it names): a retry must name the same, so that
    # what the chain checked of the retry is what it continues.
    target: tuple[str, Any] | None = None

    def open_questions(self) -> dict[str, dict[str, Any]]:
        """The questions still unanswered, as the ``inputRequests`` of an ``input_required`` result."""
        return {key: {"method": method, "params": params}
                for key, (method, params, answer) in self.questions.items() if not answer.done()}

    def wait_for_attention(self) -> asyncio.Future[None]:
        """A future done when the client has to be asked something (now, if a question is open)."""
        attention = asyncio.get_running_loop().create_future()
        if self.open_questions():
            attention.set_result(None)
        self.attention = attention
        return attention

    def call_attention(self) -> None:
        attention = self.attention
        if attention is not None and not attention.done():
            attention.set_result(None)


class InputBridge:
    """Every bridged call of one gateway, by the origin servers know it by and by its request state."""

    def __init__(self) -> None:
        self._by_origin: dict[tuple[Hashable, Any], BridgedCall] = {}
        self._by_token: dict[str, BridgedCall] = {}
        self._keys = itertools.count(1)

    def begin(self, identity: Identity, client_capabilities: Mapping[str, Any], handling: asyncio.Task[Any],
              origin: tuple[Hashable, Any], target: tuple[str, Any] | None = None) -> BridgedCall:
        call = BridgedCall(identity, client_capabilities, handling, origin, target=target)
        self._by_origin[origin] = call
        handling.add_done_callback(lambda _: self._forget(call))
        return call

    def find(self, origin: Hashable, origin_id: Any) -> BridgedCall | None:
        return self._by_origin.get((origin, origin_id))

    @staticmethod
    def is_ours(token: Any) -> bool:
        return isinstance(token, str) and token.startswith(TOKEN_PREFIX)

    def holds(self, token: Any) -> bool:
        """Whether a call waiting for input here goes by ``token`` (a replica tells its own from another's)."""
        return isinstance(token, str) and token in self._by_token

    def resume(self, token: str, identity: Identity, responses: Any,
               target: tuple[str, Any] | None = None) -> BridgedCall:
        """The call a retry's ``requestState`` names, with the retry's answers given to its questions."""
        call = self._by_token.get(token)
        if call is None or call.identity != identity:
            raise GatewayError(jsonrpc.INVALID_PARAMS,
                               "requestState names no call waiting for input (it ended, or its wait ran out)")
        if call.target is not None and target != call.target:
            raise GatewayError(jsonrpc.INVALID_PARAMS,
                               "this retry names another call than the one its requestState continues: send the same "
                               "method and name again, with inputResponses and requestState")
        if not isinstance(responses, dict):
            raise GatewayError(jsonrpc.INVALID_PARAMS, "inputResponses must be an object")
        for key, response in responses.items():
            question = call.questions.get(key)
            if question is None or question[2].done():
                continue
            if isinstance(response, dict):
                question[2].set_result(response)
            else:
                question[2].set_exception(GatewayError(jsonrpc.INVALID_PARAMS, f"inputResponses[{key!r}] is not an object"))
        self._unpark(call)
        return call

    async def ask(self, call: BridgedCall, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A server's question to the client of ``call``: it goes out with the call's next answer, and this
        returns what the client's retry says."""
        key = f"bastion-{next(self._keys)}"
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        call.questions[key] = (method, dict(params), answer)
        call.call_attention()
        try:
            return await answer
        finally:
            call.questions.pop(key, None)

    def park(self, call: BridgedCall) -> None:
        """The call's ``input_required`` has gone out; it waits for the retry, at most ``PARKED_FOR``."""
        call.parked = True
        if call.token is None:
            call.token = TOKEN_PREFIX + secrets.token_urlsafe(24)
            self._by_token[call.token] = call
        if call.expiry is None:
            call.expiry = asyncio.get_running_loop().call_later(PARKED_FOR, call.handling.cancel)

    def _unpark(self, call: BridgedCall) -> None:
        call.parked = False
        if call.expiry is not None:
            call.expiry.cancel()
            call.expiry = None

    def _forget(self, call: BridgedCall) -> None:
        self._unpark(call)
        if self._by_origin.get(call.origin) is call:
            del self._by_origin[call.origin]
        if call.token is not None:
            self._by_token.pop(call.token, None)
        for _, _, answer in call.questions.values():
            if not answer.done():
                answer.cancel()

    def close(self) -> None:
        for call in {*self._by_origin.values(), *self._by_token.values()}:
            call.handling.cancel()
