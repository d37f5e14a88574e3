"""How a browser logs in to the console, per deployment:

- ``bastion serve --http``: the same authenticator as ``/mcp`` decides. The login form takes an API key or a bearer
  token (sent as ``Authorization: Bearer``); a browser with a verified client certificate (mTLS), or behind a proxy
  that sets ``http.identity_header``, logs in with the form left empty; a gateway without authentication logs
  everyone in as its configured identity. Cedar then decides whether that identity may read the console.
- ``bastion console``: a one-time link printed to stderr; its secret opens one session, as the identity
  ``console.identity_for`` names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from bastion.auth.base import AuthFailure, Authenticator, Credentials, Unauthenticated
from bastion.console.markup import Html, tag
from bastion.console.sessions import Admitted, LoginLink
from bastion.model import Identity


class LoginRefused(Exception):
    """The credential or link did not hold; the message is for the person (it never repeats the credential)."""


@dataclass(frozen=True, slots=True)
class Presented:
    """What the login request carries besides its form."""

    headers: Mapping[str, str]
    peer: str
    certificate: Mapping[str, Any] | None


class Login(Protocol):
    def form(self, query: Mapping[str, str]) -> Html:
        """The login page's body."""

    async def identity(self, form: Mapping[str, str], presented: Presented) -> Admitted:
        """Who logs in, or raise LoginRefused."""

    async def still(self, admitted: Admitted, presented: Presented) -> bool:
        """Whether a session's login still holds for this request."""


class CredentialLogin:
    """``bastion serve --http``: what ``/mcp`` would accept, presented once and exchanged for a session."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    def form(self, query: Mapping[str, str]) -> Html:
        if isinstance(self._authenticator, Unauthenticated):
            note = tag("p", "This gateway authenticates nobody: you log in as its configured identity, "
                            f"{self._authenticator.identity.name}.")
            field = Html("")
        else:
            note = tag("p", "Log in with an API key or a bearer token this gateway accepts on /mcp. With a client "
                            "certificate, or behind a proxy that names you, leave it empty.")
            field = tag("label", "API key or bearer token ",
                        tag("input", type="password", name="credential", autocomplete="off", maxlength="16384"))
        return tag("form", note, field, tag("button", "Log in", type="submit"), method="post", action="/admin/login",
                   class_="login")

    async def identity(self, form: Mapping[str, str], presented: Presented) -> Admitted:
        credential = form.get("credential", "").strip() or None
        try:
            return Admitted(await self._authenticate(credential, presented), credential)
        except AuthFailure as failure:
            raise LoginRefused(failure.message) from None

    async def still(self, admitted: Admitted, presented: Presented) -> bool:
        # The same proof again: the key or token kept from the login, or what this request itself presents (its
        # client certificate, the proxy's identity header).
        try:
            return await self._authenticate(admitted.proof, presented) == admitted.identity
        except AuthFailure:
            return False

    async def _authenticate(self, credential: str | None, presented: Presented) -> Identity:
        headers = {k: v for k, v in presented.headers.items() if k not in ("authorization", "cookie")}
        if credential:
            headers["authorization"] = f"Bearer {credential}"
        return await self._authenticator.authenticate(
            Credentials(headers, "console", presented.peer, presented.certificate))


class LinkLogin:
    """``bastion console``: the printed link's secret, good for one session."""

    def __init__(self, link: LoginLink, identity: Identity) -> None:
        self._link, self._identity = link, identity

    def form(self, query: Mapping[str, str]) -> Html:
        token = query.get("token")
        if not token:
            return tag("p", "Open the login link `bastion console` printed (it works once; start `bastion console` "
                            "again for a new one).")
        # A GET changes nothing: the link shows this button, and only its POST spends the secret (a link preview
        # that fetches the page cannot).
        return tag("form", tag("input", type="hidden", name="token", value=token),
                   tag("p", f"Log in as {self._identity.name}."), tag("button", "Log in", type="submit"),
                   method="post", action="/admin/login", class_="login")

    async def identity(self, form: Mapping[str, str], presented: Presented) -> Admitted:
        if not self._link.redeem(form.get("token")):
            raise LoginRefused("this login link is not valid: it was used already, has expired, or is mistyped; "
                               "start `bastion console` again for a new one")
        return Admitted(self._identity)

    async def still(self, admitted: Admitted, presented: Presented) -> bool:
        return True  # the link was spent on this session; the session's cookie is the proof from here on
