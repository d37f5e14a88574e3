"""Human approval: signed request state for modern clients, and the local approval queue.

Modern clients are answered with an ``input_required`` result whose ``requestState`` is HMAC-signed and
bound to the identity, tool and a digest of the arguments, so a client cannot forge an approval or reuse
one for different arguments; each state is accepted once. The local queue is a directory of JSON files:
the gateway writes ``ID.json`` with status ``pending`` and polls it; ``bastion approve ID`` / ``deny ID``
rewrite the status atomically.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import orjson

STATE_PREFIX = "bastion-approval."
APPROVAL_KEY = "approval"


def arguments_digest(arguments: Any) -> str:
    return hashlib.sha256(orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_secret(path: str | None) -> bytes:
    """The signing key from ``path`` (created with a random key if missing), or a fresh per-process key."""
    if path is None:
        return secrets.token_bytes(32)
    file = Path(path).expanduser()
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32).hex().encode())
    return bytes.fromhex(file.read_text().strip())


class ApprovalSigner:
    """Issues and checks the ``requestState`` of an approval round trip."""

    def __init__(self, secret: bytes, ttl_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._ttl = ttl_seconds
        self._clock = clock
        self._used: dict[str, float] = {}

    def issue(self, identity: str, tool: str, digest: str) -> str:
        payload = {"i": identity, "t": tool, "a": digest, "e": self._clock() + self._ttl, "n": secrets.token_hex(8)}
        body = _b64(orjson.dumps(payload))
        return STATE_PREFIX + body + "." + _b64(hmac.new(self._secret, body.encode(), hashlib.sha256).digest())

    def check(self, state: str, identity: str, tool: str, digest: str) -> str | None:
        """None when ``state`` is a genuine, fresh, unused approval for exactly this call; else why not."""
        if not state.startswith(STATE_PREFIX):
            return "the approval state is not Bastion's"
        body, _, signature = state[len(STATE_PREFIX) :].partition(".")
        expected = hmac.new(self._secret, body.encode(), hashlib.sha256).digest()
        try:
            genuine = hmac.compare_digest(_unb64(signature), expected)
            payload = orjson.loads(_unb64(body)) if genuine else None
        except (ValueError, orjson.JSONDecodeError):
            genuine, payload = False, None
        if not genuine or not isinstance(payload, dict):
            return "the approval state is forged or damaged"
        now = self._clock()
        if payload.get("e", 0) < now:
            return "the approval expired"
        if (payload.get("i"), payload.get("t"), payload.get("a")) != (identity, tool, digest):
            return "the approval was given for a different call"
        self._used = {n: e for n, e in self._used.items() if e >= now}
        if payload["n"] in self._used:
            return "the approval was already used"
        self._used[payload["n"]] = payload["e"]
        return None


def approval_elicitation(
    server: str, tool: str, arguments: Mapping[str, Any] | None, show_values: bool, with_mode: bool
) -> dict[str, Any]:
    """``elicitation/create`` params asking the person to approve one call."""
    shown = orjson.dumps(arguments or {}, option=orjson.OPT_INDENT_2).decode() if show_values else "(hidden)"
    params: dict[str, Any] = {
        "message": f"Allow the tool '{tool}' on server '{server}' to run with these arguments?\n{shown}",
        "requestedSchema": {
            "type": "object",
            "properties": {"approve": {"type": "boolean", "title": "Approve this call", "default": False}},
            "required": ["approve"],
        },
    }
    if with_mode:
        params["mode"] = "form"
    return params


def elicitation_approves(result: Mapping[str, Any] | None) -> bool:
    """Only an explicit accept with ``approve: true`` approves; decline, cancel and anything else deny."""
    if not isinstance(result, Mapping) or result.get("action") != "accept":
        return False
    content = result.get("content")
    return isinstance(content, Mapping) and content.get("approve") is True


# --- the local approval queue ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueuedApproval:
    id: str
    status: str  # pending | approved | denied | expired
    record: dict[str, Any]


class ApprovalQueue:
    """A directory of ``ID.json`` files shared by the gateway and the ``bastion approvals`` commands."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    def _file(self, approval_id: str) -> Path:
        if not approval_id or not all(c.isalnum() or c == "-" for c in approval_id):
            raise ValueError(f"not an approval id: {approval_id!r}")
        return self.directory / f"{approval_id}.json"

    def _write(self, path: Path, record: Mapping[str, Any]) -> None:
        temporary = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))
        os.replace(temporary, path)

    def submit(self, record: Mapping[str, Any], timeout_seconds: float) -> str:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        approval_id = uuid.uuid4().hex[:12]
        now = time.time()
        entry = {**record, "id": approval_id, "status": "pending", "created": now, "expires": now + timeout_seconds}
        self._write(self._file(approval_id), entry)
        return approval_id

    def read(self, approval_id: str) -> QueuedApproval | None:
        try:
            record = orjson.loads(self._file(approval_id).read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return None
        return QueuedApproval(approval_id, str(record.get("status")), record)

    def pending(self) -> list[QueuedApproval]:
        found = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.exists() else []:
            item = self.read(path.stem)
            if item and item.status == "pending" and item.record.get("expires", 0) >= time.time():
                found.append(item)
        return found

    def settle(self, approval_id: str, approve: bool, by: str = "") -> QueuedApproval:
        """Approve or deny a pending request; raises LookupError when it is unknown or already settled."""
        item = self.read(approval_id)
        if item is None:
            raise LookupError(f"no approval request {approval_id}")
        if item.status != "pending" or item.record.get("expires", 0) < time.time():
            raise LookupError(f"approval request {approval_id} is already {item.status if item.status != 'pending' else 'expired'}")
        record = {**item.record, "status": "approved" if approve else "denied", "settled": time.time(), "by": by}
        self._write(self._file(approval_id), record)
        return QueuedApproval(approval_id, record["status"], record)

    async def wait(self, approval_id: str, timeout_seconds: float, poll_seconds: float) -> bool:
        """Poll (off the event loop) until the request is settled; a timeout denies and marks it expired."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            item = await asyncio.to_thread(self.read, approval_id)
            if item is not None and item.status != "pending":
                return item.status == "approved"
            if item is None or time.monotonic() >= deadline:
                await asyncio.to_thread(self._expire, approval_id)
                return False
            await asyncio.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))

    def _expire(self, approval_id: str) -> None:
        item = self.read(approval_id)
        if item is not None and item.status == "pending":
            self._write(self._file(approval_id), {**item.record, "status": "expired"})
