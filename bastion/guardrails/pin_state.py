"""The pins in the shared state store (bastion/state/), for replicas: what ``PinStore`` keeps in the pins file.

Chosen by the composition root when the gateway's store is shared (Redis), and by ``bastion pins`` when the
configuration's ``[state]`` is: every replica and every command then reads and changes one book. The book is one
JSON document, changed as a whole under a lock of the store (``bastion.state.lock``), so a replica recording a new
offer and a person accepting another never lose each other's change; beside it a version that moves with each
change (what a reader compares, as it compares a file's signature) and the reviews, one map field each. A store that
cannot be reached is a ``PinStoreError``: the guard withholds what it cannot check, as for an unreadable file.

The ``*_async`` methods are the gateway's, on its loop; the others block, for the CLI and the console, and run on a
``Blocking`` runner given at construction.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, Callable, Coroutine, Iterable, Mapping, TypeVar

from bastion.guardrails.pin_book import Address, Observation, PinBook, accept, apply, claim, forget
from bastion.guardrails.pin_store import PinStoreError, Signature, configuration_gone, now, refused_offers, review_lines
from bastion.state import StateStore, StateUnavailable
from bastion.state.blocking import Blocking
from bastion.state.lock import locked

BOOK_KEY = "pins:book"
VERSION_KEY = "pins:version"
LOCK_KEY = "pins:lock"
REVIEWS_KEY = "pins:reviews"
WHERE = "the shared state store's pins"

T = TypeVar("T")


class StatePins:
    path = WHERE  # what messages name where the pins are, as they name a pins file
    reviews_path = "the shared state store's pin reviews"

    def __init__(self, state: StateStore, blocking: Blocking | None = None) -> None:
        self._state = state
        self._blocking = blocking

    # ------------------------------------------------------------------------------------------ the gateway's
    async def signature_async(self) -> Signature:
        with _unavailable("read"):
            return await self._state.get(VERSION_KEY)  # type: ignore[return-value]

    async def load_async(self) -> tuple[PinBook, Signature]:
        with _unavailable("read"):
            # The version first: a change landing between the two reads is seen again at the next comparison.
            version = await self._state.get(VERSION_KEY)
            raw = await self._state.get(BOOK_KEY)
        if raw is None:
            return PinBook(), version  # type: ignore[return-value]
        try:
            return PinBook.from_json(json.loads(raw)), version  # type: ignore[return-value]
        except (ValueError, UnicodeDecodeError) as exc:
            raise PinStoreError(f"{WHERE} ({BOOK_KEY!r}) are not a pins document ({exc}); Bastion withholds what it "
                                "cannot check against them: `bastion pins forget` each server, or delete the key, to "
                                "trust what servers offer now afresh") from None

    async def record_async(self, observations: Iterable[Observation]) -> tuple[PinBook, Signature]:
        seen = list(observations)
        return await self._update(lambda book: apply(book, seen, now()))

    async def accept_async(self, server: str, key: str | None, by: str | None = None,
                           ) -> tuple[list[Address], PinBook]:
        accepted: list[Address] = []
        at = now()

        def change(book: PinBook) -> PinBook:
            changed, done = accept(book, server, key, at)
            accepted.extend(done)
            return changed

        book, _ = await self._update(change)
        if by is not None and accepted:
            await self._review(review_lines(at, by, accepted))
        return accepted, book

    async def reject_async(self, server: str, key: str | None, by: str) -> list[Address]:
        at = now()
        book, _ = await self.load_async()
        refused = refused_offers(book, server, key)
        if refused:
            await self._review(review_lines(at, by, refused, decision="rejected"))
        return refused

    async def reviews_async(self) -> list[dict[str, str]]:
        with _unavailable("read"):
            found = await self._state.map_all(REVIEWS_KEY)
        return [json.loads(found[field]) for field in sorted(found)]

    async def claim_async(self, entries: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
        moved: list[tuple[str, str]] = []

        def change(book: PinBook) -> PinBook:
            for server, entry in sorted(entries.items()):
                book, source = claim(book, server, entry, configuration_gone)
                if source is not None:
                    moved.append((server, source))
            return book

        await self._update(change)
        return moved

    async def forget_async(self, server: str, key: str | None) -> list[Address]:
        dropped: list[Address] = []

        def change(book: PinBook) -> PinBook:
            changed, gone = forget(book, server, key)
            dropped.extend(gone)
            return changed

        await self._update(change)
        return dropped

    # ------------------------------------------------------------------------------------------ the CLI's, blocking
    def signature(self) -> Signature:
        return self._run(self.signature_async())

    def load(self) -> tuple[PinBook, Signature]:
        return self._run(self.load_async())

    def record(self, observations: Iterable[Observation]) -> tuple[PinBook, Signature]:
        return self._run(self.record_async(list(observations)))

    def accept(self, server: str, key: str | None, by: str | None = None) -> tuple[list[Address], PinBook]:
        return self._run(self.accept_async(server, key, by))

    def reject(self, server: str, key: str | None, by: str) -> list[Address]:
        return self._run(self.reject_async(server, key, by))

    def reviews(self) -> list[dict[str, str]]:
        return self._run(self.reviews_async())

    def claim(self, entries: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
        return self._run(self.claim_async(entries))

    def forget(self, server: str, key: str | None) -> list[Address]:
        return self._run(self.forget_async(server, key))

    # ------------------------------------------------------------------------------------------ the store
    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._blocking is None:
            coroutine.close()
            raise RuntimeError("StatePins built without a Blocking runner: use its *_async methods")
        return self._blocking.run(coroutine)

    async def _update(self, change: Callable[[PinBook], PinBook]) -> tuple[PinBook, Signature]:
        with _unavailable("change"):
            async with locked(self._state, LOCK_KEY):
                book, version = await self.load_async()
                changed = change(book)
                if changed.records == book.records:
                    return book, version
                data = json.dumps(changed.to_json(), sort_keys=True, ensure_ascii=False).encode()
                version = secrets.token_hex(8).encode()
                await self._state.put(BOOK_KEY, data)
                await self._state.put(VERSION_KEY, version)
                return changed, version  # type: ignore[return-value]

    async def _review(self, lines: list[str]) -> None:
        with _unavailable("record who reviewed"):
            await self._state.map_put(REVIEWS_KEY, {f"{now()}.{secrets.token_hex(6)}": line.encode()
                                                    for line in lines})


class PinsUnreachable(PinStoreError):
    """The store cannot be reached now (it is not the pins that are wrong): a guard that read them before keeps
    judging against what it read, so what was withheld stays withheld and nothing new is trusted."""


class _unavailable:
    """A ``StateUnavailable`` as the ``PinStoreError`` every reader of pins handles: the pins cannot be checked."""

    def __init__(self, doing: str) -> None:
        self._doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> bool:
        if isinstance(exc, StateUnavailable):
            raise PinsUnreachable(f"cannot {self._doing} {WHERE}: {exc}; what is withheld stays withheld until the "
                                  "store answers") from None
        return False
