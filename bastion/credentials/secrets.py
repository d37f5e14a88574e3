"""Per-identity secrets of a local server (``[servers.X.identity_env]``): each identity's instance of the server is
started with that identity's own values, set beforehand with ``bastion credentials set USER SERVER NAME``.

Only that identity's process gets them (its environment at start; nobody else's instance, nor Bastion's own
instance that lists the server's tools, which gets the server's plain ``env``). A revocation or a new value is
noticed before the instance's next call, which then runs in a new process (or is refused, when revoked).
"""

from __future__ import annotations

from bastion.transport.credentials import CredentialsError
from bastion.credentials.store import TokenStore


class IdentitySecrets:
    """The ``identity_env`` of one server for one user: what their instance is started with, and whether that is
    still what the store holds."""

    def __init__(self, store: TokenStore, server: str, identity_env: dict[str, str], user: str) -> None:
        self.server = server
        self.user = user
        self._store = store
        self._wanted = dict(identity_env)  # variable -> secret name
        self._given: dict[str, str] | None = None

    async def environment(self) -> dict[str, str]:
        """The variables to set in the user's process; CredentialsError naming the command that sets what is
        missing (and never a value)."""
        stored = await self._store.get_secrets_async(self.server, self.user)
        missing = sorted({name for name in self._wanted.values() if name not in stored})
        if missing:
            commands = "; ".join(f"`bastion credentials set {self.user} {self.server} {name}`" for name in missing)
            raise CredentialsError(f"server {self.server!r} needs {self.user}'s own {', '.join(missing)}, which is "
                                   f"not set: run {commands} (it reads the value from stdin)")
        self._given = {variable: stored[name] for variable, name in self._wanted.items()}
        return dict(self._given)

    async def unchanged(self) -> bool:
        """True while the store holds what the process was started with (or it has not been started yet)."""
        if self._given is None:
            return True
        stored = await self._store.get_secrets_async(self.server, self.user)
        return all(stored.get(name) == self._given[variable] for variable, name in self._wanted.items())
