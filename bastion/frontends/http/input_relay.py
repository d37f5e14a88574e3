"""A 2026-07-28 call whose server asked for input waits on the replica that ran it (its handling parked in that
process, bastion/gateway/bridge.py); the client's retry, with ``inputResponses`` and the ``requestState`` it was
given, may reach another replica. That replica asks the others, through the store replicas share, which one holds
the call: the one that does runs the retry as if it had come to it and sends back the answer; the others say it is
not theirs. The messages are sealed with the session key ring (records.py), so that nothing written to the store by
anyone else runs a request as a caller."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any, Awaitable, Callable

import orjson

from bastion.frontends.http.records import KeyRing
from bastion.model import Identity
from bastion.state import StateStore, StateUnavailable

log = logging.getLogger("bastion.http")

CHANNEL = "http-input-retry"  # every replica listens: a retry another replica received
REPLY = "http-input-reply:"  # + a nonce: the answers to one retry
NOT_MINE, MINE = b"-", b"+"
SEALED_FOR = 60.0  # a relayed retry or answer is refused this long after it was sealed


def identity_record(identity: Identity) -> dict[str, Any]:
    return {"name": identity.name, "groups": list(identity.groups), "by": identity.authenticated_by,
            "issuer": identity.issuer, "scopes": sorted(identity.scopes), "claims": dict(identity.claims)}


def identity_of(record: dict[str, Any]) -> Identity:
    return Identity(record["name"], tuple(record["groups"]), record["by"], record["issuer"],
                    frozenset(record["scopes"]), record["claims"])


class InputRelay:
    """Retries of calls parked on another replica: asked for here (``ask``), answered there (``serve``)."""

    def __init__(self, store: StateStore, keys: KeyRing) -> None:
        self.store = store
        self.keys = keys

    async def ask(self, identity: Identity, body: bytes, wait: float) -> bytes | None:
        """The answer of the replica holding the call this retry continues, or None when no replica holds it (it
        ended, its wait ran out, or the replica that held it stopped). Waits at most ``wait`` seconds for it."""
        nonce = secrets.token_hex(12)
        replies = await self.store.subscribe(REPLY + nonce)
        try:
            request = self.keys.seal(orjson.dumps({"identity": identity_record(identity), "body": body.decode(),
                                                   "reply": nonce}), CHANNEL.encode(), time.time() + SEALED_FOR)
            listening = await self.store.publish(CHANNEL, request)
            if listening == 0:
                return None
            not_mine = 0
            async with asyncio.timeout(wait):
                async for sealed in replies:
                    reply = self.keys.open(sealed, (REPLY + nonce).encode(), time.time())
                    if reply == NOT_MINE:
                        not_mine += 1
                        if not_mine >= listening:  # every replica (this one listens too) said it is not theirs
                            return None
                    elif reply is not None and reply != MINE:
                        return reply
        except TimeoutError:
            return None
        finally:
            await replies.aclose()
        return None

    async def serve(self, holds: Callable[[Any], bool], run: Callable[[Identity, bytes], Awaitable[bytes]]) -> None:
        """Answer the retries replicas relay: run those of calls held here (``holds`` their requestState), say
        "not mine" to the others (the asking replica's own included)."""
        running: set[asyncio.Task[None]] = set()
        try:
            await self._serve(holds, run, running)
        finally:
            for task in running:  # the replica stops: retries it runs end with it
                task.cancel()

    async def _serve(self, holds: Callable[[Any], bool], run: Callable[[Identity, bytes], Awaitable[bytes]],
                     running: set[asyncio.Task[None]]) -> None:
        while True:
            try:
                retries = await self.store.subscribe(CHANNEL)
                try:
                    async for sealed in retries:
                        opened = self.keys.open(sealed, CHANNEL.encode(), time.time())
                        if opened is None:
                            continue
                        try:
                            request = orjson.loads(opened)
                            identity, body, nonce = identity_of(request["identity"]), request["body"].encode(), \
                                request["reply"]
                            state = orjson.loads(body).get("params", {}).get("requestState")
                        except (ValueError, KeyError, TypeError, AttributeError):
                            continue
                        task = asyncio.get_running_loop().create_task(
                            self._answer(holds(state), identity, body, nonce, run))
                        running.add(task)
                        task.add_done_callback(running.discard)
                finally:
                    await retries.aclose()
            except StateUnavailable as exc:
                log.warning("retries of calls held here cannot reach this replica: %s", exc)
            await asyncio.sleep(1.0)  # then listen again (a subscription that ended, or the store back)

    async def _answer(self, mine: bool, identity: Identity, body: bytes, nonce: str,
                      run: Callable[[Identity, bytes], Awaitable[bytes]]) -> None:
        bound = (REPLY + nonce).encode()
        try:
            if not mine:
                await self.store.publish(REPLY + nonce, self.keys.seal(NOT_MINE, bound, time.time() + SEALED_FOR))
                return
            await self.store.publish(REPLY + nonce, self.keys.seal(MINE, bound, time.time() + SEALED_FOR))
            answer = await run(identity, body)
            await self.store.publish(REPLY + nonce, self.keys.seal(answer, bound, time.time() + SEALED_FOR))
        except StateUnavailable as exc:
            log.warning("the answer to a retry relayed from another replica was lost: %s", exc)
