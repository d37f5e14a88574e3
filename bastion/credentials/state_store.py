"""Upstream tokens and per-identity secrets in the shared state store (bastion/state/), for replicas: the same
AES-256-GCM document as the file of ``TokenStore``, one value of the store, so that a token refreshed on one replica
is the one the next request on any other sends, and a revocation anywhere holds everywhere at the next request.

Only ciphertext reaches the store. Its key must be given in ``BASTION_CREDENTIALS_KEY``, the same on every replica:
a key file made on first use would be one per host, and each replica would read the others' writes as damage
(``required_key``). The document changes as a whole under a lock of the store (``bastion.state.lock``), so a refresh
on one replica and a revocation on another never lose each other's change; readers take no lock and decrypt again
only when the bytes changed. A store that cannot be reached is a ``CredentialsError``: what needs a token is
refused, saying why.

The ``*_async`` methods are the gateway's, on its loop; the others block, for ``bastion credentials``, on a
``Blocking`` runner given at construction.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Callable, Coroutine, Mapping, TypeVar

from bastion.credentials.store import KEY_VARIABLE, TokenStore, _empty, parse_key
from bastion.state import StateStore, StateUnavailable
from bastion.state.blocking import Blocking
from bastion.state.lock import locked
from bastion.transport.credentials import CredentialsError

DOCUMENT_KEY = "credentials:document"
LOCK_KEY = "credentials:lock"
WHERE = "the shared state store's credentials"

T = TypeVar("T")


def required_key(environ: Mapping[str, str] | None = None) -> bytes:
    """The key from ``BASTION_CREDENTIALS_KEY``, which replicas sharing a store must be given; a CredentialsError
    saying so when it is not set."""
    environ = os.environ if environ is None else environ
    if not environ.get(KEY_VARIABLE):
        raise CredentialsError(
            f"{KEY_VARIABLE} is not set: with a [state] store replicas share, upstream tokens are kept there, "
            f"encrypted with a key every replica must be given the same (a key file made on one host would differ "
            f"on the next); set {KEY_VARIABLE} to 32 random bytes in base64 on every replica and for `bastion "
            "credentials`")
    return parse_key(environ[KEY_VARIABLE])


def token_store_opener(state: StateStore | None) -> Callable[[], TokenStore]:
    """What opens the gateway's token store: the shared state store's when replicas share ``state``, else the file
    of the state directory."""
    if state is None or not state.shared:
        return TokenStore.default
    return lambda: StateTokenStore(state, required_key())


def needs_tokens(servers: Mapping[str, Any]) -> list[str]:
    """The enabled servers (of a configuration's ``servers``) whose connections read the token store."""
    return sorted(name for name, server in servers.items() if server.enabled and (
        server.identity_env or (server.auth is not None and server.auth.type in ("authorization_code",
                                                                                 "token_exchange"))))


class StateTokenStore(TokenStore):
    def __init__(self, state: StateStore, key: bytes, blocking: Blocking | None = None) -> None:
        super().__init__(WHERE, key)  # type: ignore[arg-type]  # a name for messages; no file is ever opened
        self.path = WHERE  # type: ignore[assignment]
        self._state = state
        self._blocking = blocking
        self._known: tuple[bytes, dict[str, Any]] | None = None  # the last bytes read and their document

    async def _read_async(self) -> dict[str, Any]:
        try:
            blob = await self._state.get(DOCUMENT_KEY)
        except StateUnavailable as exc:
            raise CredentialsError(f"cannot read {WHERE}: {exc}; the request that needs a token is refused until "
                                   "the store answers") from None
        if blob is None:
            return _empty()
        known = self._known
        if known is not None and known[0] == blob:  # a fresh nonce each write: the same bytes, the same document
            return known[1]
        document = self._decrypt(blob)
        self._known = (blob, document)
        return document

    async def _update_async(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        try:
            async with locked(self._state, LOCK_KEY):
                document = copy.deepcopy(await self._read_async())
                outcome = change(document)
                await self._state.put(DOCUMENT_KEY, self._encrypt(document))
                return outcome
        except StateUnavailable as exc:
            raise CredentialsError(f"cannot change {WHERE}: {exc}; nothing was changed") from None

    # ------------------------------------------------------------------------------------------ blocking
    def _read(self) -> dict[str, Any]:
        return self._run(self._read_async())

    def _update(self, change: Callable[[dict[str, Any]], Any]) -> Any:
        return self._run(self._update_async(change))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._blocking is None:
            coroutine.close()
            raise RuntimeError("StateTokenStore built without a Blocking runner: use its *_async methods")
        return self._blocking.run(coroutine)
