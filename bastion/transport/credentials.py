"""The interface an upstream HTTP transport asks for credentials through, defined by the transport as httpx defines
its ``Auth``: bastion/credentials implements it, and the transport imports nothing of theirs."""

from __future__ import annotations

from typing import Mapping, Protocol


class UpstreamCredentials(Protocol):
    """The credentials of one upstream connection (one server, and for per-user credentials one identity)."""

    async def headers(self) -> Mapping[str, str]:
        """Headers to add to the next request (``Authorization: Bearer ...``); fetched or refreshed as needed.
        Raises CredentialsError when none can be had (the message says what the user must do)."""

    async def refused(self, status: int, www_authenticate: str | None) -> bool:
        """The server answered 401 or 403 with this challenge: True when new credentials were obtained (a refresh,
        a step-up of scopes) and the request is worth sending once more, False when not."""


URL_ELICITATION_REQUIRED = -32042  # the specification's error for "open this link first" (2025-11-25)


def url_elicitation(link: str, message: str) -> dict:
    """The data of a URL-elicitation-required error naming ``link``; the same link is the same elicitation, so a
    client asked twice for one authorization opens it once."""
    import hashlib

    return {"elicitations": [{"mode": "url", "url": link, "message": message,
                              "elicitationId": hashlib.sha256(link.encode("utf-8")).hexdigest()[:32]}]}


class CredentialsError(Exception):
    """No credentials for an upstream request; ``link`` is where the user completes an authorization, if any."""

    def __init__(self, message: str, link: str | None = None) -> None:
        super().__init__(message)
        self.link = link
