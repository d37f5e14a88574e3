"""Upstream tokens and per-identity secrets, kept encrypted at rest in one file of the state directory.

The file is AES-256-GCM (``cryptography``'s AESGCM) over a JSON document, with a fresh nonce each write; the key
is ``BASTION_CREDENTIALS_KEY`` (32 bytes, base64 or hex) or a 0600 key file beside the store, made on first use.
Writes are atomic (a temporary file renamed over the old) and happen under an exclusive ``flock``, so the
gateway refreshing a token and ``bastion credentials revoke`` cannot lose each other's change. A reader reads the
file each time and decrypts it again only when its bytes changed, so a revocation made by another process takes
effect on the running gateway's next request.

The store's methods block (file I/O, a lock another process may hold): on the event loop call the ``*_async``
ones, which run them in a worker thread. With a state store replicas share, the same encrypted document is kept
there instead (credentials/state_store.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import secrets
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bastion.files import exclusive_lock, replace_atomically
from bastion import paths
from bastion.transport.credentials import CredentialsError

KEY_VARIABLE = "BASTION_CREDENTIALS_KEY"
STORE_NAME = "credentials.enc"
KEY_NAME = "credentials.key"
_MAGIC = b"BASTION-CREDENTIALS-1\n"  # also the AEAD's associated data: a file of another format never decrypts
_NONCE_BYTES = 12
_KEY_BYTES = 32
_KEY_FIX = ("set BASTION_CREDENTIALS_KEY to 32 random bytes in base64, e.g. the output of "
            "`python -c \"import base64,secrets;print(base64.b64encode(secrets.token_bytes(32)).decode())\"`")


@dataclass(frozen=True, slots=True)
class TokenSet:
    """An access token for one upstream server (and one user, for per-user tokens), with what renews it."""

    access_token: str
    refresh_token: str | None = None
    expires_at: float | None = None  # seconds since the epoch; None: the server said nothing of its lifetime
    scope: str | None = None  # space-separated, as the token endpoint granted it
    token_type: str = "Bearer"

    def __repr__(self) -> str:  # never a token in a log line or a traceback
        return f"TokenSet(expires_at={self.expires_at!r}, scope={self.scope!r}, token_type={self.token_type!r})"

    @classmethod
    def from_response(cls, response: Mapping[str, Any], now: float | None = None,
                      refresh_token: str | None = None) -> "TokenSet":
        """The tokens of a token endpoint's answer (RFC 6749 5.1); ``refresh_token`` is kept when the answer
        brings no new one (a refresh grant may keep the old one valid)."""
        access_token = response.get("access_token")
        if not isinstance(access_token, str) or not access_token:
            raise CredentialsError("the token endpoint's answer has no access_token")
        expires_in = response.get("expires_in")
        expires_at = None
        if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool):
            expires_at = (time.time() if now is None else now) + float(expires_in)
        new_refresh = response.get("refresh_token")
        scope = response.get("scope")
        token_type = response.get("token_type")
        return cls(access_token=access_token,
                   refresh_token=new_refresh if isinstance(new_refresh, str) and new_refresh else refresh_token,
                   expires_at=expires_at,
                   scope=scope if isinstance(scope, str) else None,
                   token_type=token_type if isinstance(token_type, str) and token_type else "Bearer")

    def expires_within(self, seconds: float, now: float | None = None) -> bool:
        """True when the token is gone or will be within ``seconds`` (a token of unknown lifetime never is)."""
        if self.expires_at is None:
            return False
        return self.expires_at - (time.time() if now is None else now) <= seconds

    def authorization(self) -> str:
        """The Authorization header's value; a "bearer" token type is written "Bearer" as RFC 6750 does."""
        kind = "Bearer" if self.token_type.lower() == "bearer" else self.token_type
        return f"{kind} {self.access_token}"

    def to_json(self) -> dict[str, Any]:
        return {"access_token": self.access_token, "refresh_token": self.refresh_token,
                "expires_at": self.expires_at, "scope": self.scope, "token_type": self.token_type}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TokenSet":
        return cls(access_token=data["access_token"], refresh_token=data.get("refresh_token"),
                   expires_at=data.get("expires_at"), scope=data.get("scope"),
                   token_type=data.get("token_type") or "Bearer")


class StoredToken(NamedTuple):
    """What ``TokenStore.list`` shows of a stored token: never the token itself."""

    server: str
    user: str
    expires_at: float | None
    scope: str | None


class StoredSecret(NamedTuple):
    """What ``TokenStore.list_secrets`` shows of a per-identity secret: its name, never its value."""

    server: str
    user: str
    name: str


def parse_key(text: str) -> bytes:
    """A 32-byte key written as base64 (standard or URL-safe, padded or not) or as 64 hex digits."""
    value = text.strip()
    candidates: list[Callable[[str], bytes]] = [bytes.fromhex] if len(value) == 2 * _KEY_BYTES else []
    candidates += [lambda v: base64.b64decode(v + "=" * (-len(v) % 4), validate=True),
                   lambda v: base64.urlsafe_b64decode(v + "=" * (-len(v) % 4))]
    for decode in candidates:
        try:
            key = decode(value)
        except (ValueError, binascii.Error):
            continue
        if len(key) == _KEY_BYTES:
            return key
    raise CredentialsError(f"{KEY_VARIABLE} is not a 32-byte key; {_KEY_FIX}")


def load_or_create_key(key_file: Path, environ: Mapping[str, str] | None = None) -> bytes:
    """The store's key: the environment's when set, else the key file's, made (0600, never overwritten) when
    missing. A key file anyone else may read is refused: it would open every stored token."""
    environ = os.environ if environ is None else environ
    if environ.get(KEY_VARIABLE):
        return parse_key(environ[KEY_VARIABLE])
    key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not key_file.exists():
        # Written whole under another name, then linked into place: a process starting at the same moment finds
        # either no key file or a complete one, and of two made at once only one is ever linked.
        partial = key_file.with_name(f".{key_file.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode() + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.link(partial, key_file)
        except FileExistsError:
            pass
        finally:
            partial.unlink(missing_ok=True)
    return _read_key_file(key_file)


def _read_key_file(key_file: Path) -> bytes:
    mode = key_file.stat().st_mode
    if mode & 0o077:
        raise CredentialsError(f"{key_file} may be read by others (mode {mode & 0o777:o}); "
                               f"run `chmod 600 {key_file}`")
    try:
        return parse_key(key_file.read_text(encoding="ascii"))
    except CredentialsError:
        raise CredentialsError(f"{key_file} does not hold a 32-byte key; delete it (every stored credential is then "
                               "lost) or put the right key back") from None


def _empty() -> dict[str, Any]:
    return {"tokens": {}, "secrets": {}}


def _token(document: dict[str, Any], server: str, user: str) -> TokenSet | None:
    entry = document["tokens"].get(server, {}).get(user)
    return TokenSet.from_json(entry) if entry is not None else None


def _putting(server: str, user: str, tokens: TokenSet) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["tokens"].setdefault(server, {})[user] = tokens.to_json()
    return change


def _deleting(server: str, user: str | None) -> Callable[[dict[str, Any]], int]:
    def change(document: dict[str, Any]) -> int:
        users = document["tokens"].get(server, {})
        if user is None:
            document["tokens"].pop(server, None)
            return len(users)
        removed = int(users.pop(user, None) is not None)
        if not users:
            document["tokens"].pop(server, None)
        return removed
    return change


def _revoking(user: str, server: str | None) -> Callable[[dict[str, Any]], int]:
    def change(document: dict[str, Any]) -> int:
        removed = 0
        for kind in ("tokens", "secrets"):
            for name in [server] if server is not None else list(document[kind]):
                users = document[kind].get(name)
                if users and user in users:
                    entry = users.pop(user)
                    removed += len(entry) if kind == "secrets" else 1
                    if not users:
                        del document[kind][name]
        return removed
    return change


class TokenStore:
    """Upstream tokens by (server, user), and per-identity secrets by (server, user, name), in one encrypted file.

    ``user`` is the identity's name; Bastion's own tokens (client credentials) may be kept under ``""``.
    """

    def __init__(self, path: Path, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise CredentialsError(f"the credentials key must be {_KEY_BYTES} bytes; {_KEY_FIX}")
        self.path = Path(path)
        self._aead = AESGCM(key)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._guard = threading.Lock()  # worker threads of one process share the cached document
        self._cached: tuple[bytes, dict[str, Any]] | None = None

    @classmethod
    def default(cls, directory: Path | None = None, environ: Mapping[str, str] | None = None) -> "TokenStore":
        """The store in Bastion's state directory (or ``directory``), with its key from the environment or the
        key file beside it."""
        base = paths.state_dir() if directory is None else Path(directory)
        return cls(base / STORE_NAME, load_or_create_key(base / KEY_NAME, environ))

    # tokens

    def get(self, server: str, user: str) -> TokenSet | None:
        return _token(self._read(), server, user)

    def put(self, server: str, user: str, tokens: TokenSet) -> None:
        self._update(_putting(server, user, tokens))

    def delete(self, server: str, user: str | None = None) -> int:
        """Forget one user's token for ``server``, or every user's when ``user`` is None; how many were."""
        return self._update(_deleting(server, user))

    def list(self) -> list[StoredToken]:
        tokens = self._read()["tokens"]
        return sorted(StoredToken(server, user, entry.get("expires_at"), entry.get("scope"))
                      for server, users in tokens.items() for user, entry in users.items())

    # per-identity secrets (``[servers.X.identity_env]``)

    def get_secrets(self, server: str, user: str) -> dict[str, str]:
        return dict(self._read()["secrets"].get(server, {}).get(user, {}))

    def set_secret(self, server: str, user: str, name: str, value: str) -> None:
        def change(document: dict[str, Any]) -> None:
            document["secrets"].setdefault(server, {}).setdefault(user, {})[name] = value
        self._update(change)

    def list_secrets(self) -> list[StoredSecret]:
        stored = self._read()["secrets"]
        return sorted(StoredSecret(server, user, name)
                      for server, users in stored.items() for user, names in users.items() for name in names)

    # both

    def revoke(self, user: str, server: str | None = None) -> int:
        """Forget everything of ``user`` (tokens and secrets), for one server or all; how many entries were."""
        return self._update(_revoking(user, server))

    # the same, off the event loop: what the gateway calls

    async def get_async(self, server: str, user: str) -> TokenSet | None:
        return _token(await self._read_async(), server, user)

    async def put_async(self, server: str, user: str, tokens: TokenSet) -> None:
        await self._update_async(_putting(server, user, tokens))

    async def delete_async(self, server: str, user: str | None = None) -> int:
        return await self._update_async(_deleting(server, user))

    async def get_secrets_async(self, server: str, user: str) -> dict[str, str]:
        return dict((await self._read_async())["secrets"].get(server, {}).get(user, {}))

    async def _read_async(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._read)

    async def _update_async(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        return await asyncio.to_thread(self._update, change)

    # the file

    def _read(self) -> dict[str, Any]:
        with self._guard:
            return self._load()

    def _update(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        with self._guard, self._locked():
            document = json.loads(json.dumps(self._load()))  # a copy: a failed write leaves the cache as the file
            outcome = change(document)
            self._write(document)
            self._cached = None
            return outcome

    def _load(self) -> dict[str, Any]:
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            self._cached = None
            return _empty()
        # every write has a fresh nonce, so the same bytes are the same document: no decryption, and unlike a
        # stat's inode, size and time, no two different writes can look alike
        if self._cached is not None and self._cached[0] == blob:
            return self._cached[1]
        document = self._decrypt(blob)
        self._cached = (blob, document)
        return document

    def _decrypt(self, blob: bytes) -> dict[str, Any]:
        """The document of ``blob``: a CredentialsError naming ``self.path`` when it is not one of this key."""
        if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + _NONCE_BYTES:
            raise CredentialsError(f"{self.path} is not a Bastion credentials file")
        nonce = blob[len(_MAGIC):len(_MAGIC) + _NONCE_BYTES]
        try:
            plain = self._aead.decrypt(nonce, blob[len(_MAGIC) + _NONCE_BYTES:], _MAGIC)
        except InvalidTag:
            raise CredentialsError(f"{self.path} cannot be decrypted with this key (another key, or a damaged "
                                   f"file); set {KEY_VARIABLE} to the key it was written with, or delete the file "
                                   "and grant the credentials again") from None
        document = json.loads(plain)
        return {**_empty(), **document}

    def _encrypt(self, document: dict[str, Any]) -> bytes:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return _MAGIC + nonce + self._aead.encrypt(nonce, json.dumps(document).encode(), _MAGIC)

    def _write(self, document: dict[str, Any]) -> None:
        replace_atomically(self.path, self._encrypt(document))

    def _locked(self) -> AbstractContextManager[None]:
        return exclusive_lock(self._lock_path)
