"""Human approval: signed request state for modern clients, and the local approval queue.

Modern clients are answered with an ``input_required`` result whose ``requestState`` is HMAC-signed and
bound to the identity, tool and a digest of the arguments, so a client cannot forge an approval or reuse
one for different arguments. Each state is accepted once: redeeming it claims its nonce in the gateway's
``StateStore`` (bastion/state/), an atomic check-and-set, so of any number of requests carrying one
state — one after another, at once, on other connections, or on other replicas sharing the state — one runs
the call. The local queue is a directory of JSON files:
the gateway writes ``ID.json`` with status ``pending`` and polls it; ``bastion approve ID`` / ``deny ID``
rewrite the status atomically. A request ends approved, denied, expired (its timeout passed) or withdrawn
(the client cancelled the call or went away); one whose gateway process is gone reads as orphaned.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import hmac
import os
import secrets
import shlex
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import orjson

from bastion.state import StateStore

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


USED_KEY = "approval-used:"  # a used state's record in the shared state, by its nonce
# A used state is remembered this much past its expiry, for replicas whose clocks disagree about when that is.
CLOCK_ALLOWANCE_SECONDS = 60.0
# Why a state that was redeemed already is refused (the refusal says "Call to 'X' was not approved: " first).
ALREADY_USED = ("this approval was already used (one approval runs one call); send the call again without "
                "requestState to ask again")


@dataclass(frozen=True, slots=True)
class Redeemed:
    """What a ``requestState`` of Bastion's was good for: nothing (``problem`` says why), the approval of one call, or
    the next round of a call a person approved already, whose server asked for input (``server_state``: the state
    that server gave that round, None if it gave none)."""

    problem: str | None
    continuing: bool = False
    server_state: Any = None


class ApprovalSigner:
    """Issues and redeems the ``requestState`` of an approval round trip, each good once."""

    def __init__(self, secret: bytes, ttl_seconds: float, used: StateStore,
                 clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._ttl = ttl_seconds
        self._used = used
        self._clock = clock  # the wall clock: a state issued by one replica may be redeemed by another

    def issue(self, identity: str, tool: str, digest: str, *, continuing: bool = False,
              server_state: Any = None) -> str:
        """A state asking a person to approve this call, or with ``continuing`` one for the next round of a call a
        person approved, carrying the state its server gave that round (if any)."""
        payload: dict[str, Any] = {"i": identity, "t": tool, "a": digest, "e": self._clock() + self._ttl,
                                   "n": secrets.token_hex(16)}
        if continuing:
            payload["c"] = 1
            if server_state is not None:
                payload["s"] = server_state
        body = _b64(orjson.dumps(payload))
        return STATE_PREFIX + body + "." + _b64(hmac.new(self._secret, body.encode(), hashlib.sha256).digest())

    def verify(self, state: str, identity: str, tool: str, digest: str) -> tuple[str | None, dict[str, Any]]:
        """(None, its payload) when ``state`` is genuine, fresh and for exactly this call; else (why not, {}). Whether
        it was used is for ``redeem`` to say."""
        if not state.startswith(STATE_PREFIX):
            return "the approval state is not Bastion's", {}
        body, _, signature = state[len(STATE_PREFIX) :].partition(".")
        expected = hmac.new(self._secret, body.encode(), hashlib.sha256).digest()
        try:
            genuine = hmac.compare_digest(_unb64(signature), expected)
            payload = orjson.loads(_unb64(body)) if genuine else None
        except (ValueError, orjson.JSONDecodeError):
            genuine, payload = False, None
        if not genuine or not isinstance(payload, dict) or not isinstance(payload.get("n"), str):
            return "the approval state is forged or damaged", {}
        if payload.get("e", 0) < self._clock():
            return "the approval expired", {}
        if (payload.get("i"), payload.get("t"), payload.get("a")) != (identity, tool, digest):
            return "the approval was given for a different call", {}
        return None, payload

    async def redeem(self, state: str, identity: str, tool: str, digest: str) -> Redeemed:
        """Use ``state`` for this call: checked, then its nonce claimed in the shared state, so that it is used once
        however many requests bring it, whenever and wherever they come."""
        problem, payload = self.verify(state, identity, tool, digest)
        if problem is not None:
            return Redeemed(problem)
        lives = float(payload["e"]) - self._clock()
        if not await self._used.claim(USED_KEY + payload["n"], lives + CLOCK_ALLOWANCE_SECONDS):
            return Redeemed(ALREADY_USED)
        return Redeemed(None, continuing=bool(payload.get("c")), server_state=payload.get("s"))


def approval_elicitation(
    server: str, tool: str, arguments: Mapping[str, Any] | None, show_values: bool, with_mode: bool, note: str = "",
    who: str = "",
) -> dict[str, Any]:
    """``elicitation/create`` params asking the person to approve one call; ``note`` (what the session read that
    could steer the model, say) comes first; ``who`` names the caller asking (``Identity.describe()``)."""
    shown = orjson.dumps(arguments or {}, option=orjson.OPT_INDENT_2).decode() if show_values else "(hidden)"
    asking = f"{who} asks: " if who else ""
    params: dict[str, Any] = {
        "message": f"{note + chr(10) if note else ''}{asking}Allow the tool '{tool}' on server '{server}' to run with "
                   f"these arguments?\n{shown}",
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

# What a request's record says once nothing waits for it any more, besides approved and denied.
EXPIRED = "expired"  # nobody answered before the timeout: the call was refused
WITHDRAWN = "withdrawn"  # the client cancelled the call or went away
# Never written: a pending request whose gateway process is gone (killed, crashed) reads as this.
ORPHANED = "orphaned"


def process_started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), or None if there is no such process.

    A pid alone names a process only while it runs; with its start time it cannot be mistaken for a later
    process that reused the number.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Field 22 of stat is the start time; the split above starts at field 3 (state).
    return fields[19].decode() if len(fields) > 19 else None


def approve_command(approval_id: str, queue_dir: str | os.PathLike[str], default_dir: str) -> str:
    """The command a person runs to approve ``approval_id``; names the queue unless it is the default one."""
    directory = Path(queue_dir).expanduser()
    if directory.resolve() == Path(default_dir).expanduser().resolve():
        return f"bastion approve {approval_id}"
    return f"bastion approve {approval_id} --queue-dir {shlex.quote(str(directory))}"


@dataclass(frozen=True, slots=True)
class QueuedApproval:
    id: str
    status: str  # pending | approved | denied | expired | withdrawn | orphaned
    record: dict[str, Any]

    @property
    def seconds_left(self) -> float:
        return max(0.0, float(self.record.get("expires", 0)) - time.time())


class ApprovalQueue:
    """A directory of ``ID.json`` files shared by the gateway and the ``bastion approvals`` commands.

    Each record names the gateway process waiting for it (pid and start time), so a request whose gateway is
    gone reads as orphaned rather than pending. Changes of status happen under a lock on the directory, so
    an approval and the gateway's own withdrawal or timeout cannot both win.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    def _file(self, approval_id: str) -> Path:
        return self.directory / f"{valid_id(approval_id)}.json"

    def command(self, approval_id: str) -> str:
        """The command a person runs to approve ``approval_id``."""
        from bastion.policy.config import ApprovalConfig

        return approve_command(approval_id, self.directory, ApprovalConfig().queue_dir)

    # Off the event loop: what the gateway calls (the shared state's queue, approval_state.py, has the same).
    async def submit_async(self, record: Mapping[str, Any], timeout_seconds: float) -> str:
        return await asyncio.to_thread(self.submit, record, timeout_seconds)

    async def close_request_async(self, approval_id: str, status: str, why: str) -> str:
        await asyncio.to_thread(self.close_request, approval_id, status, why)
        return status

    def _write(self, path: Path, record: Mapping[str, Any]) -> None:
        temporary = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))
        os.replace(temporary, path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def submit(self, record: Mapping[str, Any], timeout_seconds: float) -> str:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        approval_id = uuid.uuid4().hex[:12]
        now = time.time()
        pid = os.getpid()
        entry = {**record, "id": approval_id, "status": "pending", "created": now, "expires": now + timeout_seconds,
                 "timeout_seconds": timeout_seconds, "pid": pid, "pid_started": process_started(pid)}
        self._write(self._file(approval_id), entry)
        return approval_id

    def read(self, approval_id: str) -> QueuedApproval | None:
        """The request as it stands: a pending one past its time reads as expired, one whose gateway is gone as
        orphaned."""
        try:
            record = orjson.loads(self._file(approval_id).read_bytes())
        except (FileNotFoundError, NotADirectoryError, orjson.JSONDecodeError):
            return None
        if not isinstance(record, dict):
            return None
        status = str(record.get("status"))
        if status == "pending":
            if float(record.get("expires", 0)) < time.time():
                status = EXPIRED
            elif not _waiter_alive(record):
                status = ORPHANED
        return QueuedApproval(approval_id, status, record)

    def all(self) -> list[QueuedApproval]:
        """Every request in the queue, oldest first."""
        found = []
        for path in self.directory.glob("*.json") if self.directory.exists() else []:
            item = self.read(path.stem)
            if item is not None:
                found.append(item)
        return sorted(found, key=lambda item: float(item.record.get("created", 0)))

    def pending(self) -> list[QueuedApproval]:
        """The requests a gateway is waiting on now."""
        return [item for item in self.all() if item.status == "pending"]

    def settle(self, approval_id: str, approve: bool, by: str = "") -> QueuedApproval:
        """Approve or deny a pending request; raises LookupError, saying why, when nothing waits for it."""
        if not self._file(approval_id).exists():
            raise LookupError(f"no approval request {approval_id} in {self.directory}")
        with self._locked():
            item = self.read(approval_id)
            if item is None:
                raise LookupError(f"no approval request {approval_id} in {self.directory}")
            if item.status != "pending":
                raise LookupError(not_pending(item))
            record = {**item.record, "status": "approved" if approve else "denied", "settled": time.time(), "by": by}
            self._write(self._file(approval_id), record)
        return QueuedApproval(approval_id, record["status"], record)

    async def wait(self, approval_id: str, timeout_seconds: float, poll_seconds: float) -> str:
        """Poll (off the event loop) until the request is settled: its final status (approved, denied, expired).

        A timeout marks it expired. A cancelled wait (the client withdrew the call) marks it withdrawn, then
        lets the cancellation go on.
        """
        deadline = time.monotonic() + timeout_seconds
        try:
            while True:
                item = await asyncio.to_thread(self.read, approval_id)
                if item is not None and item.status in ("approved", "denied"):
                    return item.status
                if item is None or time.monotonic() >= deadline:
                    await asyncio.to_thread(self.close_request, approval_id, EXPIRED, "")
                    return EXPIRED
                await asyncio.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))
        except asyncio.CancelledError:
            # Shielded: the record must say withdrawn even while the cancellation unwinds this task.
            marking = asyncio.ensure_future(asyncio.to_thread(self.close_request, approval_id, WITHDRAWN,
                                                              "the client withdrew the call"))
            try:
                await asyncio.shield(marking)
            except asyncio.CancelledError:
                pass
            raise

    def close_request(self, approval_id: str, status: str, why: str) -> None:
        """Mark a request that is still pending as ``status`` (expired, withdrawn, answered elsewhere)."""
        try:
            with self._locked():
                item = self.read(approval_id)
                if item is not None and item.record.get("status") == "pending":
                    self._write(self._file(approval_id), {**item.record, "status": status, "settled": time.time(),
                                                          **({"why": why} if why else {})})
        except OSError:
            pass  # the queue directory went away: nothing is left to mark


def _waiter_alive(record: Mapping[str, Any]) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int):
        return True  # a record from before pids were recorded
    started = process_started(pid)
    if started is None:
        return _exists_without_proc(pid)
    recorded = record.get("pid_started")
    return recorded is None or recorded == started


def _exists_without_proc(pid: int) -> bool:
    if Path("/proc/self/stat").exists():
        return False  # /proc works, and has no such process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def valid_id(approval_id: str) -> str:
    """``approval_id`` when it is one (letters, digits, dashes: never a path or a key of the store of its own)."""
    if not approval_id or len(approval_id) > 64 or not all(c.isalnum() and c.isascii() or c == "-"
                                                            for c in approval_id):
        raise ValueError(f"not an approval id: {approval_id!r}")
    return approval_id


def not_pending(item: QueuedApproval) -> str:
    """Why a request can no longer be approved or denied, in words a person can act on."""
    record = item.record
    where = f"{record.get('server')}/{record.get('tool')}"
    if item.status in ("approved", "denied"):
        by = f" by {record['by']}" if record.get("by") else ""
        return f"approval request {item.id} ({where}) is already {item.status}{by}"
    if item.status == EXPIRED:
        waited = record.get("timeout_seconds")
        after = f" after {waited:g} s" if isinstance(waited, (int, float)) else ""
        return (f"approval request {item.id} ({where}) timed out{after} and its call was refused; "
                "nothing waits for it (the client may call again)")
    if item.status == WITHDRAWN:
        return (f"approval request {item.id} ({where}) was withdrawn: the client cancelled the call or "
                "disconnected; nothing waits for it")
    if item.status == ORPHANED:
        asker = f"pid {record.get('pid')}" if "pid" in record else record.get("replica", "a replica")
        return (f"approval request {item.id} ({where}) is orphaned: the gateway that asked ({asker}) "
                "is no longer running, so approving it would run nothing")
    return f"approval request {item.id} ({where}) is {item.status}, not pending"
