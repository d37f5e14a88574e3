"""Where the guardrails keep what outlives one request (a caller's taint, the values its answers carried, the budgets
of servers' sampling and consent requests): in the gateway's ``StateStore``, so that replicas sharing one store judge
a caller alike (docs/guardrails.md, "Across replicas").

Keys are built from digests, never from a caller's words: a name, group or issuer may hold ":" or "*", and an
identity ``("a:b", "c")`` must not share a key with ``("a", "b:c")``. What the store cannot be asked is said in one
way, so every guardrail that fails closed for it says the same thing.
"""

from __future__ import annotations

import hashlib

import msgspec

from bastion.model import GatewayRequest, Identity
from bastion.state import StateUnavailable

PREFIX = "guardrails:"
UNREACHABLE = "the shared state cannot be reached"


def digest(*parts: object) -> str:
    """An unambiguous name for ``parts`` (strings, None, lists of strings): their JSON array, hashed."""
    return hashlib.blake2b(msgspec.json.encode(parts), digest_size=16).hexdigest()


def caller(identity: Identity) -> str:
    """Who a caller is, as the store names it: the fields that make two identities the same caller."""
    return digest(identity.name, list(identity.groups), identity.authenticated_by, identity.issuer)


def key(kind: str, *parts: object) -> str:
    """The store key of ``kind`` (one of the guardrails' own words) for ``parts``."""
    return f"{PREFIX}{kind}:{digest(*parts)}"


def caller_key(kind: str, identity: Identity) -> str:
    return f"{PREFIX}{kind}:{caller(identity)}"


def client_of(request: GatewayRequest) -> str:
    """Whose budget a server's request to a client spends: a handshake-era session's (its id, which a session
    shared between replicas keeps); a 2026-07-28 caller's, whose every request is a connection of its own (its id
    would give each request a budget of its own), or anyone's without a session id."""
    session = request.session
    if session.era == "modern" or not session.session_id:
        return f"caller {caller(session.identity)}"
    return f"session {session.session_id}"


def unreachable(error: StateUnavailable) -> str:
    """Why a guardrail could not decide, for the caller and the log."""
    return f"{UNREACHABLE} ({error})" if str(error) else UNREACHABLE
