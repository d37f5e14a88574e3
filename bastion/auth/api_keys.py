"""API keys: named, scoped, expiring credentials for callers that OAuth is too much for.

A key is ``bst_`` and 43 URL-safe characters (32 random bytes). The prefix lets the chain tell a key from a JWT in
``Authorization: Bearer`` without trying to parse it, and lets secret scanners recognise a leaked one. The key
file keeps only each key's SHA-256: the key carries 256 bits of entropy, so nobody can search the hash for it and
a slow password hash (bcrypt, argon2) would buy nothing but milliseconds on every request; a key is not a
password a person chose.

The file is shared by ``bastion keys`` and every running gateway: each change is a read-modify-write under an
exclusive ``flock`` on a lock file beside it, replacing the file atomically (mode 0600), so a reader never sees
half of one. A gateway looks at the file's signature at most once a second, on a worker thread, and reads it
again when it changed: a key revoked or created takes effect on a running gateway within a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from bastion.files import exclusive_lock, file_signature, replace_atomically
from bastion.auth.base import API_KEY_PREFIX, AuthFailure, Credentials
from bastion.model import Identity

log = logging.getLogger("bastion.auth")

KEY_PREFIX = API_KEY_PREFIX
HEADER = "x-api-key"
FORMAT = "bastion-api-keys"
DEFAULT_FILE_NAME = "api_keys.json"
# How stale a running gateway's view of the file may be; a stat a second costs nothing measurable.
RECHECK_SECONDS = 1.0
MAX_KEY_CHARS = 256  # a key is 47; anything much longer is refused unhashed
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}")
_DURATION = re.compile(r"(\d+)\s*([mhdwy])")
_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}

Signature = tuple[int, int, int] | None  # (inode, size, mtime in ns); None when there is no file


class ApiKeyFileError(Exception):
    """The key file cannot be read or written, or a change to it cannot be made; the message names the fix."""


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_expiry(text: str, now: datetime) -> datetime:
    """``30d``, ``12h``, ``90m``, ``2w``, ``1y`` from ``now``, or an ISO date or date-time (UTC unless it says)."""
    value = text.strip().lower()
    if (found := _DURATION.fullmatch(value)) is not None:
        amount = int(found.group(1))
        if amount <= 0:
            raise ValueError(f"--expires {text!r}: a key must live a while; give e.g. 30d")
        return now + timedelta(seconds=amount * _UNITS[found.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--expires {text!r}: expected a duration (90m, 12h, 30d, 2w, 1y) or a date "
                         "(2027-01-31 or 2027-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    if moment <= now:
        raise ValueError(f"--expires {text!r} is in the past")
    return moment


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a key name: use letters, digits and . _ @ : + - (it becomes the "
                         "caller's identity name), at most 128 characters")
    return name


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key as the file keeps it: its name (the caller's identity), the hash of the key, and what it may do."""

    name: str
    digest: str
    scopes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    created: str = ""
    expires: str | None = None  # ISO 8601 UTC; None: never

    def expires_at(self) -> float | None:
        if self.expires is None:
            return None
        return datetime.fromisoformat(self.expires.replace("Z", "+00:00")).timestamp()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "scopes": list(self.scopes), "groups": list(self.groups),
                "created": self.created, "expires": self.expires}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ApiKey":
        if not isinstance(data, Mapping):
            raise ValueError("a key entry is not an object")
        name, hashed = data.get("name"), data.get("digest")
        if not isinstance(name, str) or not isinstance(hashed, str) or not hashed.startswith("sha256:"):
            raise ValueError("a key entry lacks its name or its sha256 digest")
        scopes, groups = data.get("scopes") or [], data.get("groups") or []
        if not all(isinstance(s, str) for s in [*scopes, *groups]):
            raise ValueError(f"key {name!r}: scopes and groups must be lists of strings")
        expires = data.get("expires")
        key = cls(name, hashed, tuple(scopes), tuple(groups), str(data.get("created") or ""),
                  expires if isinstance(expires, str) else None)
        key.expires_at()  # an unreadable date is the file's error, said now, not at some request
        return key


class ApiKeyFile:
    """The key file on disk. These calls block on the disk: a gateway makes them on a worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")

    def signature(self) -> Signature:
        try:
            return file_signature(self.path)
        except OSError as exc:
            raise ApiKeyFileError(f"{self.path}: cannot read the API key file: {exc.strerror}") from None

    def load(self) -> tuple[dict[str, ApiKey], Signature]:
        """The keys by name (none when there is no file yet), and the file's signature."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                text = f.read()
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            raise ApiKeyFileError(f"{self.path}: cannot read the API key file: {exc.strerror}") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("keys"), list):
                raise ValueError(f'expected {{"format": "{FORMAT}", "keys": [...]}}')
            keys = [ApiKey.from_json(entry) for entry in data["keys"]]
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiKeyFileError(f"{self.path}: not an API key file ({exc}); Bastion leaves it as it is and accepts "
                                  "no key from it: repair it, or move it away and create the keys again") from None
        return {key.name: key for key in keys}, (st.st_ino, st.st_size, st.st_mtime_ns)

    def create(self, name: str, scopes: tuple[str, ...] = (), groups: tuple[str, ...] = (),
               expires: datetime | None = None, now: datetime | None = None) -> tuple[str, ApiKey]:
        """A new key named ``name``: the key itself (shown once, never stored) and its record."""
        check_name(name)
        key = new_key()
        record = ApiKey(name, digest(key), tuple(dict.fromkeys(scopes)), tuple(dict.fromkeys(groups)),
                        iso(now or now_utc()), iso(expires) if expires is not None else None)

        def change(keys: dict[str, ApiKey]) -> dict[str, ApiKey]:
            if name in keys:
                raise ApiKeyFileError(f"a key named {name!r} exists already: revoke it first (bastion keys revoke "
                                      f"{name}) or choose another name")
            return {**keys, name: record}

        self._update(change)
        return key, record

    def revoke(self, name: str) -> ApiKey | None:
        """Delete the key named ``name``; the record deleted, or None when there is none of that name."""
        gone: list[ApiKey] = []

        def change(keys: dict[str, ApiKey]) -> dict[str, ApiKey]:
            if name in keys:
                gone.append(keys[name])
                return {k: v for k, v in keys.items() if k != name}
            return keys

        self._update(change)
        return gone[0] if gone else None

    def _update(self, change: Callable[[dict[str, ApiKey]], dict[str, ApiKey]]) -> None:
        with self._locked():
            keys, _ = self.load()
            changed = change(keys)
            if changed != keys:
                self._write(changed)

    def _locked(self) -> AbstractContextManager[None]:
        return exclusive_lock(self._lock_path, lambda exc: ApiKeyFileError(
            f"{self._lock_path}: cannot create the API key file's lock: {exc.strerror}; make its folder writable or "
            "name another file (auth.api_keys, --file)"))

    def _write(self, keys: dict[str, ApiKey]) -> None:
        data = {"format": FORMAT, "keys": [keys[name].to_json() for name in sorted(keys)]}
        encoded = json.dumps(data, indent=1, ensure_ascii=False).encode() + b"\n"
        try:
            # 0600: the hashes are no secret worth the name, but who may call is nobody's business but the owner's
            replace_atomically(self.path, encoded)
        except OSError as exc:
            raise ApiKeyFileError(f"{self.path}: cannot write the API key file: {exc.strerror}; make its folder "
                                  "writable or name another file (auth.api_keys, --file)") from None


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key a request carries (``X-API-Key``, or ``Authorization: Bearer bst_...``), or None."""
    if HEADER in headers:
        return headers[HEADER].strip()
    authorization = headers.get("authorization", "")
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value.startswith(KEY_PREFIX):
        return value
    return None


@dataclass(frozen=True, slots=True)
class _Known:
    """What a request's key is checked against: the file's keys by digest, as last read."""

    by_digest: Mapping[str, ApiKey]
    expiry: Mapping[str, float | None]
    signature: Signature

    @classmethod
    def of(cls, keys: Mapping[str, ApiKey], signature: Signature) -> "_Known":
        return cls({k.digest: k for k in keys.values()}, {k.digest: k.expires_at() for k in keys.values()}, signature)


class ApiKeyMethod:
    """The ``AuthMethod`` for API keys: a key in the file, not expired, is the identity named after it."""

    asks = "an API key (X-API-Key, or Authorization: Bearer bst_...)"

    def __init__(self, keys: ApiKeyFile, *, recheck_seconds: float = RECHECK_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.file = keys
        self._recheck = recheck_seconds
        self._clock = clock
        self._known = _Known({}, {}, None)
        self._error: str | None = None
        self._checked_at = float("-inf")
        self._lock = asyncio.Lock()

    def load(self) -> None:
        """Read the file now (blocking): at start-up, so a broken file is said before the gateway serves."""
        keys, signature = self.file.load()
        if signature is None:
            log.warning("%s does not exist yet, so no API key is accepted until bastion keys create writes it "
                        "(a running gateway sees it appear)", self.file.path)
        self._known = _Known.of(keys, signature)
        self._checked_at = time.monotonic()

    def presented(self, credentials: Credentials) -> bool:
        return presented_key(credentials.headers) is not None

    bearer_credential = True  # presented as Authorization: Bearer bst_... (or X-API-Key)

    def challenge(self) -> str | None:
        return None  # a key has no challenge of its own; the bearer challenge, if any, is the OAuth method's

    async def authenticate(self, credentials: Credentials) -> Identity:
        key = presented_key(credentials.headers) or ""
        known = await self._current()
        if self._error is not None:
            # fail closed: a file that cannot be read may hold a revocation
            raise AuthFailure(503, "the gateway cannot check API keys right now; try again later", None,
                              "temporarily_unavailable", "api_key_file_unreadable")
        # The lookup is by the key's SHA-256: what an attacker varies is the key, and no timing of a dict lookup
        # tells them anything about a hash they cannot invert; compare_digest keeps the final check constant-time.
        hashed = digest(key) if len(key) <= MAX_KEY_CHARS else ""
        record = known.by_digest.get(hashed)
        if record is None or not hmac.compare_digest(record.digest, hashed):
            raise AuthFailure(401, "the API key is not valid (unknown or revoked)", None, "invalid_token",
                              "unknown_api_key")
        expires = known.expiry[hashed]
        if expires is not None and self._clock() >= expires:
            raise AuthFailure(401, f"the API key {record.name!r} expired at {record.expires}; create a new one "
                                   "with bastion keys create", None, "invalid_token", "expired_api_key")
        return Identity(record.name, record.groups, "api_key", None, frozenset(record.scopes))

    async def _current(self) -> _Known:
        if time.monotonic() - self._checked_at >= self._recheck:
            async with self._lock:
                if time.monotonic() - self._checked_at >= self._recheck:
                    await asyncio.to_thread(self._refresh)
                    self._checked_at = time.monotonic()
        return self._known

    def _refresh(self) -> None:
        try:
            if self.file.signature() == self._known.signature and self._error is None:
                return
            keys, signature = self.file.load()
        except ApiKeyFileError as exc:
            if self._error != str(exc):
                log.error("%s", exc)
            self._error = str(exc)
            return
        if self._error is not None:
            log.warning("%s: the API key file reads again; API keys are accepted again", self.file.path)
        self._known = _Known.of(keys, signature)
        self._error = None


def default_path() -> Path:
    from bastion.paths import state_dir

    return state_dir() / DEFAULT_FILE_NAME


def resolve(path: Path, base: Path | None) -> Path:
    """``auth.api_keys`` as a file: ``~`` expanded, a relative path read from the configuration file's folder."""
    path = path.expanduser()
    return path if path.is_absolute() or base is None else base / path
