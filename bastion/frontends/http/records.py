"""Handshake-era sessions that outlive the replica that made them. With a store replicas share (``[state] url``) and
``http.session_key_files``, each Streamable HTTP session has a record in the store: who holds it, the protocol
version it negotiated, the client's info and capabilities, whether it said ``notifications/initialized``, its log
level. A replica handed a session id it does not know reads the record and takes the session up (its own server
connections; nothing is replayed to them); DELETE on any replica deletes the record, and the others drop their
copy.

A record is sealed (AES-GCM) with the first key of the ring and opened with any of them, each key told by an id
(a digest of the key) written before the sealed bytes; the session id is its associated data (a record moved to
another id does not open) and an expiry is sealed with it (a record kept past it, by a store or a copy, is
refused). Rotating keys: put the new file first, and drop the old one once ``http.session_idle_timeout`` has passed
(the records it sealed have expired by then).

Why a record and not a sealed token as the session id (bench/session_resume.py measures both): the id stays 32
characters, a session ends everywhere when it is deleted (a token would be good until its expiry whatever the
client did), and what changes during a session (initialized, the log level) is written to the record, where a
token would have to be given to the client again, which the transport has no way to do."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
import time
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Sequence

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bastion.frontends.http.quotas import Holder
from bastion.model import Identity
from bastion.state import StateStore

log = logging.getLogger("bastion.http")

RECORD_KEY = "http-session:"
PENDING_KEY = "http-session-pending:"  # the calls of a session whose answer is a resumable stream, by stream key
EVENTS_KEY = "http-session-events:"  # the messages of a session's GET stream, numbered, for any replica to stream
ANSWERS_KEY = "http-session-answers:"  # the client's answers to one replica's requests, POSTed to another
ANSWERS_KEPT = 64
ENDED_KEY = "http-session-ended:"  # who ended a session: exactly one replica gives its quota back
ENDED_CHANNEL = "http-session-ended"  # the ids of sessions ended, for the replicas holding a copy
# A client's notifications/cancelled that reached a replica not running the request it names, for the one that is.
CANCELLED_CHANNEL = "http-session-cancelled"
# What secrets.token_urlsafe(24) makes: an id of any other shape was never made here, and is looked up nowhere (a
# client's ":" or "*" never reaches a store key).
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{32}")
MAX_RECORD_BYTES = 64 * 1024  # a record larger than this (a client's huge info or capabilities) is not shared
_KEY_ID_BYTES = 4
_NONCE_BYTES = 12
_EXPIRY = struct.Struct(">d")


def well_formed(session_id: str) -> bool:
    return _SESSION_ID.fullmatch(session_id) is not None


class KeyRing:
    """The keys that seal session records: the first seals, every one opens."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a key ring needs at least one key")
        self._ring = [(hashlib.sha256(b"bastion session key id" + key).digest()[:_KEY_ID_BYTES],
                       AESGCM(hashlib.sha256(b"bastion session record" + key).digest())) for key in keys]
        self._by_id = {key_id: aead for key_id, aead in reversed(self._ring)}

    @classmethod
    def from_files(cls, files: Sequence[str], folder: Path | None) -> "KeyRing":
        """The keys of ``http.session_key_files``, each read from ``folder`` (the configuration's) when relative;
        a ValueError names the file and the fix."""
        keys = []
        for name in files:
            path = Path(name).expanduser()
            if not path.is_absolute() and folder is not None:
                path = folder / path
            try:
                text = path.read_text().strip()
            except OSError as exc:
                raise ValueError(f"http.session_key_files: cannot read {path}: {exc.strerror}") from None
            try:
                key = bytes.fromhex(text)
            except ValueError:
                key = b""
            if len(key) < 32:
                raise ValueError(f"http.session_key_files: {path} does not hold a key of 64 hex digits (32 bytes) or "
                                 f"more; make one with: python3 -c 'import secrets; print(secrets.token_hex(32))'")
            keys.append(key)
        return cls(keys)

    def seal(self, plain: bytes, bound_to: bytes, expires_at: float) -> bytes:
        key_id, aead = self._ring[0]
        nonce = os.urandom(_NONCE_BYTES)
        return key_id + nonce + aead.encrypt(nonce, _EXPIRY.pack(expires_at) + plain, key_id + bound_to)

    def open(self, sealed: bytes, bound_to: bytes, now: float) -> bytes | None:
        """What ``seal`` sealed for ``bound_to``, or None: a key retired or unknown, bytes changed, another id's
        record, or past its expiry."""
        key_id, nonce, body = (sealed[:_KEY_ID_BYTES], sealed[_KEY_ID_BYTES:_KEY_ID_BYTES + _NONCE_BYTES],
                               sealed[_KEY_ID_BYTES + _NONCE_BYTES:])
        aead = self._by_id.get(key_id)
        if aead is None or len(nonce) != _NONCE_BYTES:
            return None
        try:
            plain = aead.decrypt(nonce, body, key_id + bound_to)
        except InvalidTag:
            return None
        if len(plain) < _EXPIRY.size or _EXPIRY.unpack_from(plain)[0] < now:
            return None
        return plain[_EXPIRY.size:]


def caller_of(identity: Identity) -> list[Any]:
    """What makes two identities the same caller (``Identity.__eq__``): who may present a session."""
    return [identity.name, list(identity.groups), identity.authenticated_by, identity.issuer]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    caller: list[Any]
    holder: Holder
    protocol_version: str
    client_capabilities: Mapping[str, Any]
    client_info: Mapping[str, Any] | None
    initialized: bool
    log_level: str | None

    def encode(self) -> bytes:
        return orjson.dumps({"caller": self.caller, "holder": [list(self.holder.key), self.holder.who,
                                                                self.holder.setting, self.holder.limit],
                             "version": self.protocol_version, "capabilities": self.client_capabilities,
                             "info": self.client_info, "initialized": self.initialized, "level": self.log_level})

    @classmethod
    def decode(cls, data: bytes) -> "SessionRecord":
        record = orjson.loads(data)
        key, who, setting, limit = record["holder"]
        return cls(record["caller"], Holder(tuple(key), who, setting, limit), record["version"],
                   record["capabilities"], record["info"], record["initialized"], record["level"])

    def presented_by(self, identity: Identity) -> bool:
        return self.caller == caller_of(identity)


class SessionRecords:
    """The store's records of handshake-era sessions, sealed with ``keys``; each lives ``idle_timeout`` after its
    last write, and is written again (refreshed) at most every ``refresh_seconds`` while its session is used."""

    def __init__(self, store: StateStore, keys: KeyRing, idle_timeout: float) -> None:
        self.store = store
        self.keys = keys
        self.idle_timeout = idle_timeout
        # Often enough that a session in use never expires, rarely enough that a request seldom writes.
        self.refresh_seconds = min(10.0, idle_timeout / 10)

    async def save(self, session_id: str, record: SessionRecord) -> bool:
        """Write the record; False (nothing written) when it is larger than ``MAX_RECORD_BYTES``: a client's info
        and capabilities are its own to fill, and a session is not worth megabytes of the store, rewritten at each
        refresh."""
        encoded = record.encode()
        if len(encoded) > MAX_RECORD_BYTES:
            return False
        sealed = self.keys.seal(encoded, session_id.encode(), time.time() + self.idle_timeout)
        await self.store.put(RECORD_KEY + session_id, sealed, self.idle_timeout)
        return True

    async def load(self, session_id: str) -> SessionRecord | None:
        """The record of ``session_id``, or None when there is none (never made, ended, expired) or it does not
        open (a retired key, a record tampered with): either way, a session nobody may continue."""
        if not well_formed(session_id):
            return None
        sealed = await self.store.get(RECORD_KEY + session_id)
        if sealed is None:
            return None
        plain = self.keys.open(sealed, session_id.encode(), time.time())
        if plain is None:
            log.info("session %s…: its record does not open with http.session_key_files (a retired key, or "
                     "altered); it is treated as unknown", session_id[:8])
            return None
        try:
            return SessionRecord.decode(plain)
        except (ValueError, KeyError, TypeError):
            return None

    async def exists(self, session_id: str) -> bool:
        return await self.store.recorded(RECORD_KEY + session_id)

    # ------------------------------------------------------------------ calls whose answer is a stream
    async def pending(self, session_id: str, stream_key: str, request_id: Any) -> None:
        """A call's answer became a resumable stream on this replica: if the replica stops, the client that resumes
        the stream on another learns which request's outcome is unknown."""
        await self.store.map_put(PENDING_KEY + session_id, {stream_key: orjson.dumps(request_id)}, self.idle_timeout)

    async def answered(self, session_id: str, stream_key: str) -> None:
        await self.store.map_delete(PENDING_KEY + session_id, [stream_key])

    async def lost(self, session_id: str, stream_key: str) -> tuple[bool, Any]:
        """Whether ``stream_key`` is a call another replica was running for this session, and its request id (taken:
        the client is told once)."""
        found = await self.store.map_get(PENDING_KEY + session_id, stream_key)
        if found is None:
            return False, None
        await self.store.map_delete(PENDING_KEY + session_id, [stream_key])
        return True, orjson.loads(found)

    # ------------------------------------------------------------------ the GET stream's events
    async def add_event(self, session_id: str, frame: bytes, keep: int) -> None:
        """A message for the session's GET stream, wherever it is open: numbered in the session's log (the last
        ``keep`` kept, for ``Last-Event-ID``), and the replicas streaming it woken."""
        await self.store.append(EVENTS_KEY + session_id, frame, keep=max(keep, 1), seconds=self.idle_timeout)
        await self.store.publish(EVENTS_KEY + session_id, b"")

    async def newest_event(self, session_id: str) -> int:
        _, entries = await self.store.read_after(EVENTS_KEY + session_id, 0)
        return entries[-1][0] if entries else 0

    def events(self, session_id: str, after: int) -> AsyncIterator[tuple[int, bytes]]:
        """The session's GET stream messages numbered after ``after`` (those kept), then each as it comes."""
        return self._follow_log(EVENTS_KEY + session_id, after)

    async def _follow_log(self, key: str, after: int) -> AsyncIterator[tuple[int, bytes]]:
        """A numbered log's entries after ``after`` (those kept), then each as it is appended (a nudge on the
        channel of the same name wakes the reader); ends when the subscription does (the store closed)."""
        nudges = await self.store.subscribe(key)
        try:
            waiting = aiter(nudges)
            while True:
                _, entries = await self.store.read_after(key, after)
                for number, frame in entries:
                    after = number
                    yield number, frame
                try:
                    await anext(waiting)
                except StopAsyncIteration:
                    return
        finally:
            await nudges.aclose()

    # ------------------------------------------------------------------ answers to another replica's requests
    async def relay_answer(self, session_id: str, frame: bytes) -> None:
        """The client answered, here, a request another replica sent it (sampling, elicitation, roots): kept for
        that replica in the session's log of answers, and that replica woken."""
        await self.store.append(ANSWERS_KEY + session_id, frame, keep=ANSWERS_KEPT, seconds=self.idle_timeout)
        await self.store.publish(ANSWERS_KEY + session_id, b"")

    async def answers(self, session_id: str) -> AsyncIterator[bytes]:
        """The answers relayed for this session by other replicas, from those already kept, as they come."""
        async with aclosing(self._follow_log(ANSWERS_KEY + session_id, 0)) as log:
            async for _, frame in log:
                yield frame

    async def relay_cancel(self, session_id: str, notification: bytes) -> None:
        """The client cancelled, here, a request of its session that another replica runs: every replica is told
        (cancellations are rare; which replica runs a request is recorded nowhere), the one running it cancels."""
        await self.store.publish(CANCELLED_CHANNEL, orjson.dumps({"session": session_id,
                                                                  "notification": notification.decode()}))

    async def end(self, session_id: str) -> bool:
        """End the session everywhere: its record deleted and the replicas told. True for the one caller (of any
        replica) that ended it, which gives its place in the quota back."""
        first = await self.store.claim(ENDED_KEY + session_id, self.idle_timeout)
        await self.store.delete(RECORD_KEY + session_id)
        await self.store.delete(PENDING_KEY + session_id)
        await self.store.delete(ANSWERS_KEY + session_id)
        await self.store.delete(EVENTS_KEY + session_id)
        if first:
            await self.store.publish(ENDED_CHANNEL, session_id.encode())
        return first
