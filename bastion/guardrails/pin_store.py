"""The pins file: the ``PinBook`` on disk, shared by every Bastion process of a user and by ``bastion pins``.

Every change is a read-modify-write under an exclusive ``flock`` on a lock file beside it, so two gateways that
see a server for the first time at once, or a gateway and ``bastion pins accept``, never lose each other's
records; the file is replaced atomically (a temporary file in the same folder, flushed, then renamed), so a reader
never sees half of one. Readers take no lock. A file that cannot be read or is not a pins file is never
overwritten: the error names it and says how to fix it.

Who accepted what is kept beside it, one JSON line per accepted definition (``<pins file>.reviews.jsonl``,
appended under the same lock): the pins file says what is trusted, the reviews say who decided to trust it.

These calls block on the disk: the gateway calls their ``*_async`` forms, which run them on a worker thread. With a
shared state store (replicas), the pins are kept there instead, with the same methods (pin_state.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from bastion.files import exclusive_lock, file_signature, replace_atomically
from bastion.guardrails.pin_book import Address, Observation, PinBook, accept, apply, claim, forget, split_id

# What changes whenever the pins do: (inode, size, mtime in ns) of the file (None when there is none), the version
# of the shared state's pins (bytes).
Signature = tuple[int, int, int] | bytes | None


def configuration_gone(configuration: str) -> bool:
    """Whether a configuration file no longer exists (moved or deleted): its pins are for the taking."""
    return not os.path.lexists(configuration)


def refused_offers(book: PinBook, server: str, key: str | None) -> list[Address]:
    """What ``server`` offers instead of its pins (``key`` only, when given): what a refusal is recorded for."""
    return [(s, kind, k) for (s, kind, k), record in sorted(book.records.items())
            if s == server and (key is None or k == key) and record.offered is not None]


def review_lines(at: str, by: str, reviewed: list[Address], decision: str | None = None) -> list[str]:
    """One JSON line per reviewed definition: who accepted (or, with ``decision``, rejected) it, and when."""
    said = {} if decision is None else {"decision": decision}
    return [json.dumps({"at": at, "by": by, "server": split_id(s)[1], "configuration": split_id(s)[0],
                        "kind": kind, "key": key, **said}, ensure_ascii=False) for s, kind, key in reviewed]


class PinStoreError(Exception):
    """The pins file cannot be read or written; the message names the file and the fix."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class PinStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self.reviews_path = path.with_name(path.name + ".reviews.jsonl")

    def signature(self) -> Signature:
        """What changes whenever the file is replaced: a reader compares it to know whether to read again."""
        try:
            return file_signature(self.path)
        except OSError as exc:
            raise PinStoreError(f"{self.path}: cannot read the pins file: {exc.strerror}") from None

    def load(self) -> tuple[PinBook, Signature]:
        """The book as the file has it now (empty when there is no file yet), and the file's signature."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                text = f.read()
        except FileNotFoundError:
            return PinBook(), None
        except OSError as exc:
            raise PinStoreError(f"{self.path}: cannot read the pins file: {exc.strerror}") from None
        try:
            book = PinBook.from_json(json.loads(text))
        except (ValueError, UnicodeDecodeError) as exc:
            raise PinStoreError(
                f"{self.path}: not a pins file ({exc}); Bastion leaves it as it is and withholds what it cannot "
                "check against it: repair it, or move it away to trust what servers offer now afresh") from None
        return book, (st.st_ino, st.st_size, st.st_mtime_ns)

    def record(self, observations: Iterable[Observation]) -> tuple[PinBook, Signature]:
        """Write ``observations`` into the file as it is now, and return the book they make."""
        seen = list(observations)
        return self._update(lambda book: apply(book, seen, now()))

    def accept(self, server: str, key: str | None, by: str | None = None) -> tuple[list[Address], PinBook]:
        """Trust what ``server`` offers now (``key`` only, when given) and return what was accepted; ``by`` (who
        accepted it) is written to the reviews beside the pins file."""
        accepted: list[Address] = []
        at = now()

        def change(book: PinBook) -> PinBook:
            changed, done = accept(book, server, key, at)
            accepted.extend(done)
            return changed

        with self._locked():
            book, _ = self._update(change, locked=True)
            if by is not None and accepted:
                self._review(review_lines(at, by, accepted))
        return accepted, book

    def reject(self, server: str, key: str | None, by: str) -> list[Address]:
        """Record that ``by`` refused what ``server`` offers instead of its pins (``key`` only, when given): the pins
        stay as they are, so the change stays withheld; the refusal is a review with ``"decision": "rejected"``."""
        at = now()
        with self._locked():
            book, _ = self.load()
            refused = refused_offers(book, server, key)
            if refused:
                self._review(review_lines(at, by, refused, decision="rejected"))
        return refused

    def reviews(self) -> list[dict[str, str]]:
        """Every accepted (or rejected) definition, oldest first: ``{"at", "by", "server", "configuration", "kind",
        "key"}`` (the configuration file of the server, None for one pinned by name alone), and ``"decision":
        "rejected"`` for a refusal."""
        try:
            text = self.reviews_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PinStoreError(f"{self.reviews_path}: cannot read the pins reviews: {exc.strerror}") from None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _review(self, lines: list[str]) -> None:
        try:
            fd = os.open(self.reviews_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        except OSError as exc:
            raise PinStoreError(f"{self.reviews_path}: the definitions were accepted but who accepted them could not "
                                f"be recorded: {exc.strerror}") from None

    def claim(self, entries: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
        """Move to each identity of ``entries`` (identity -> its pinned configuration entry) that has no pins yet the
        pins of the same server kept by name alone or under a configuration file that is gone, when they pinned the
        same entry (pin_book.claim); return (identity, where its pins came from) for each moved."""
        moved: list[tuple[str, str]] = []

        def change(book: PinBook) -> PinBook:
            for server, entry in sorted(entries.items()):
                book, source = claim(book, server, entry, configuration_gone)
                if source is not None:
                    moved.append((server, source))
            return book

        self._update(change)
        return moved

    def forget(self, server: str, key: str | None) -> list[Address]:
        """Drop what is pinned of ``server`` (``key`` only, when given) and return what was dropped."""
        dropped: list[Address] = []

        def change(book: PinBook) -> PinBook:
            changed, gone = forget(book, server, key)
            dropped.extend(gone)
            return changed

        self._update(change)
        return dropped

    # The same, off the event loop: what the gateway calls (the shared state's pins, pin_state.py, have the same).
    async def signature_async(self) -> Signature:
        return await asyncio.to_thread(self.signature)

    async def load_async(self) -> tuple[PinBook, Signature]:
        return await asyncio.to_thread(self.load)

    async def record_async(self, observations: Iterable[Observation]) -> tuple[PinBook, Signature]:
        return await asyncio.to_thread(self.record, list(observations))

    async def accept_async(self, server: str, key: str | None, by: str | None = None,
                           ) -> tuple[list[Address], PinBook]:
        return await asyncio.to_thread(self.accept, server, key, by)

    async def reject_async(self, server: str, key: str | None, by: str) -> list[Address]:
        return await asyncio.to_thread(self.reject, server, key, by)

    async def reviews_async(self) -> list[dict[str, str]]:
        return await asyncio.to_thread(self.reviews)

    def _update(self, change: Callable[[PinBook], PinBook], locked: bool = False) -> tuple[PinBook, Signature]:
        if not locked:
            with self._locked():
                return self._update(change, locked=True)
        book, signature = self.load()
        changed = change(book)
        if changed.records == book.records:
            return book, signature
        return changed, self._write(changed)

    def _locked(self) -> AbstractContextManager[None]:
        return exclusive_lock(self._lock_path, lambda exc: PinStoreError(
            f"{self._lock_path}: cannot create the pins file's lock: {exc.strerror}; make its folder writable or set "
            "guardrails.pins.path"))

    def _write(self, book: PinBook) -> Signature:
        data = json.dumps(book.to_json(), indent=1, sort_keys=True, ensure_ascii=False).encode() + b"\n"
        try:
            st = replace_atomically(self.path, data)
        except OSError as exc:
            raise PinStoreError(f"{self.path}: cannot write the pins file: {exc.strerror}; make its folder writable "
                                "or set guardrails.pins.path") from None
        return (st.st_ino, st.st_size, st.st_mtime_ns)
