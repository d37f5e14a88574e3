"""Authorization with Cedar: loading and validating policy files, building entities, deciding.

Policies are parsed and validated against ``SCHEMA`` once, at start; errors name the file and the line of
the policy at fault. Each policy is known by its ``@id`` annotation, or ``file:line`` without one, and that
name is the rule the audit trail records. A permit carrying ``@approval("required")`` makes the call wait for
a person whenever it is one of the policies that allowed it.

The principal is the caller's Identity: a ``User`` in its groups, with its scopes, how it authenticated, its
issuer and the attributes ``auth.claims.attributes`` names (``principal.tenant``) as attributes.

Cedar evaluation costs ~100 µs, more than the whole per-call budget, so decisions are cached. The cache key
holds only what the policies can see: the principal and groups, the principal attributes some policy reads,
the action, the resource and its attributes, and the parts of the context that some policy actually reads
(found by walking the parsed policies). Policies that never read ``context.arguments`` are therefore decided
once per tool and principal.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import cedarpy
import orjson

from bastion.model import Identity, ToolEntry
from bastion.policy.cedar_text import ADMIN_ACTIONS, DEFAULT_POLICY, NAMESPACE, PRINCIPAL_ATTRIBUTES, SCHEMA, schema
from bastion.policy.config import PolicyStartError
from bastion.policy.decision import Decision, Effect

ACTIONS = (
    "list_tools",
    "list_resources",
    "list_prompts",
    "call_tool",
    "read_resource",
    "get_prompt",
    "answer_sampling",
    "answer_elicitation",
    "answer_roots",
)
SERVER_REQUEST_ACTIONS = {
    "sampling/createMessage": "answer_sampling",
    "elicitation/create": "answer_elicitation",
    "roots/list": "answer_roots",
}
DEFAULT_DENY_RULE = "default-deny"
# Trust levels whose tool annotations count. "reviewed" is what `bastion import` writes for a server the user
# looked at: its annotations are believed as first seen (pinning them is what keeps a later change from
# raising them), while what only "trusted" grants, such as sampling, stays with the policy's trust checks.
ANNOTATIONS_TRUSTED_AT = frozenset({"trusted", "reviewed"})


class PolicyLoadError(PolicyStartError, ValueError):
    """A policy file that cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class PolicySource:
    name: str  # file path, or "<default>"
    text: str


def statement_lines(text: str) -> list[int]:
    """The 1-based line where each top-level Cedar statement starts (strings and comments skipped)."""
    lines: list[int] = []
    line, start, i, n = 1, None, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == '"':
            if start is None:
                start = line
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                elif text[i] == "\n":
                    line += 1
                i += 1
        elif c == ";":
            if start is not None:
                lines.append(start)
            start = None
        elif not c.isspace() and start is None:
            start = line
        i += 1
    return lines


def _first_parse_error(source: PolicySource) -> str:
    try:
        cedarpy.PolicySet.from_str(source.text)
        return ""
    except ValueError as error:
        message = str(error)
    starts = statement_lines(source.text)
    chunks = source.text.split("\n")
    # Parse statement by statement to find the line at fault.
    for index, line in enumerate(starts):
        end = starts[index + 1] - 1 if index + 1 < len(starts) else len(chunks)
        piece = "\n".join(chunks[line - 1 : end])
        try:
            cedarpy.PolicySet.from_str(piece)
        except ValueError as error:
            return f"{source.name}:{line}: {error}"
    tail = starts[-1] if starts else 1
    return f"{source.name}:{tail}: {message}"


_USER_ATTRIBUTE_HINT = ("; the principal's attributes are scopes, authenticated_by, issuer and those "
                        "auth.claims.attributes names (add the claim there)")


def _validate(source: PolicySource, schema_text: str = SCHEMA) -> dict[str, Any]:
    """Parse and validate one file; returns its policies (Cedar JSON) keyed by Bastion rule name."""
    problem = _first_parse_error(source)
    if problem:
        raise PolicyLoadError(problem)
    starts = statement_lines(source.text)
    result = cedarpy.validate_policies(source.text, schema_text)
    if not result.validation_passed:
        messages = []
        for error in result.errors:
            index = int(error.policy_id[len("policy") :]) if error.policy_id.startswith("policy") else -1
            line = starts[index] if 0 <= index < len(starts) else 1
            hint = _USER_ATTRIBUTE_HINT if "on entity type `Bastion::User` not found" in str(error.error) else ""
            messages.append(f"{source.name}:{line}: {error.error}{hint}")
        raise PolicyLoadError("; ".join(messages) or f"{source.name}: policies do not match the schema")
    parsed = json.loads(cedarpy.policies_to_json_str(source.text))
    if parsed.get("templates"):
        raise PolicyLoadError(f"{source.name}: policy templates are not supported; write static policies")
    named: dict[str, Any] = {}
    for key, policy in parsed["staticPolicies"].items():
        index = int(key[len("policy") :])
        line = starts[index] if index < len(starts) else 1
        rule = policy.get("annotations", {}).get("id") or f"{source.name}:{line}"
        if rule in named:
            raise PolicyLoadError(f"{source.name}:{line}: policy id {rule!r} is used twice")
        named[rule] = policy
    return named


def _attributes_read(policies: Mapping[str, Any], variable: str) -> frozenset[str] | None:
    """Which ``<variable>.X`` the policies read; None when some policy uses ``variable`` as a whole."""
    used: set[str] = set()
    whole = False

    def walk(node: Any) -> None:
        nonlocal whole
        if isinstance(node, dict):
            for op in (".", "has"):
                inner = node.get(op)
                if isinstance(inner, dict) and inner.get("left") == {"Var": variable}:
                    used.add(inner["attr"])
                    return
            if node.get("Var") == variable:
                whole = True
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(list(policies.values()))
    return None if whole else frozenset(used)


def _context_attributes(policies: Mapping[str, Any]) -> frozenset[str] | None:
    return _attributes_read(policies, "context")


def _principal_attributes(policies: Mapping[str, Any], declared: tuple[str, ...]) -> tuple[str, ...]:
    """The principal attributes some policy reads, in schema order; all of them when a condition uses the
    principal otherwise than by reading an attribute (a comparison or a group test, say, or a way of reaching an
    attribute this walk does not follow), so that no attribute a decision depends on is left out of the cache key."""
    read = _attributes_read(policies, "principal")
    return declared if read is None else tuple(name for name in declared if name in read)


_CEDAR_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CEDAR_RESERVED = frozenset({"true", "false", "if", "then", "else", "in", "is", "like", "has", "principal",
                             "action", "resource", "context"})


def check_claim_attributes(names: Iterable[str]) -> tuple[str, ...]:
    """The attribute names ``auth.claims.attributes`` gives, checked as Cedar principal attributes."""
    checked = tuple(names)
    for name in checked:
        if not _CEDAR_IDENTIFIER.fullmatch(name) or name in _CEDAR_RESERVED or name.startswith("__cedar"):
            raise PolicyLoadError(f"auth.claims.attributes: {name!r} cannot be a Cedar attribute name; use letters, "
                                  "digits and _ (not starting with a digit, not a Cedar keyword)")
        if name in PRINCIPAL_ATTRIBUTES:
            raise PolicyLoadError(f"auth.claims.attributes: {name!r} is already a principal attribute Bastion sets "
                                  f"({', '.join(PRINCIPAL_ATTRIBUTES)}); name the claim's attribute otherwise")
    return checked


def claim_text(value: Any) -> str:
    """A claim as the String attribute policies see: a string as it is, "" when absent, other JSON as its text."""
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def principal_attributes(identity: Identity, claim_attributes: tuple[str, ...]) -> dict[str, Any]:
    """The principal entity's attributes (Cedar JSON) for ``identity``: every declared one, so that no policy's
    condition fails to evaluate (a forbid that errors does not apply)."""
    attrs: dict[str, Any] = {
        "scopes": sorted(identity.scopes),
        "authenticated_by": identity.authenticated_by,
        "issuer": identity.issuer or "",
    }
    claims = identity.claims
    for name in claim_attributes:
        attrs[name] = claim_text(claims.get(name))
    return attrs


def _principal_value(identity: Identity, name: str) -> Any:
    """One principal attribute as part of a decision cache key (hashable)."""
    if name == "scopes":
        return identity.scopes
    if name == "authenticated_by":
        return identity.authenticated_by
    if name == "issuer":
        return identity.issuer or ""
    return claim_text(identity.claims.get(name))


def load_policy_sources(paths: Iterable[Path], include_default: bool) -> list[PolicySource]:
    sources = [PolicySource("<default>", DEFAULT_POLICY)] if include_default else []
    for path in paths:
        try:
            sources.append(PolicySource(str(path), path.read_text(encoding="utf-8")))
        except OSError as error:
            raise PolicyLoadError(f"{path}: cannot read the policy file ({error.strerror})") from error
    return sources


# --- entities -------------------------------------------------------------------------------------------


def _uid(kind: str, ident: str) -> dict[str, str]:
    return {"type": f"{NAMESPACE}::{kind}", "id": ident}


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """A tool's attributes as policies see them, with annotation hints believed only from trusted or reviewed
    servers."""

    uid: str
    server: str
    name: str
    trust: str
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool
    annotations_trusted: bool
    pinned: bool

    @staticmethod
    def of(entry: ToolEntry, pinned: bool = False) -> "ToolFacts":
        hints = entry.definition.get("annotations") or {}
        trusted = entry.server_trust in ANNOTATIONS_TRUSTED_AT
        # Bastion's own knowledge of the tool (a reference package's read, a plausible claim pinning holds still)
        # counts whatever the server's trust; its other annotations count only as trust says.
        read_only = entry.reads_only or (trusted and hints.get("readOnlyHint") is True)
        return ToolFacts(
            uid=f"{entry.server}/{entry.original_name}",
            server=entry.server,
            name=entry.original_name,
            trust=entry.server_trust,
            read_only=read_only,
            # destructiveHint defaults to true; only a trusted or reviewed server can lower it.
            destructive=not read_only and not (trusted and hints.get("destructiveHint") is False),
            idempotent=read_only or (trusted and hints.get("idempotentHint") is True),
            open_world=not (trusted and hints.get("openWorldHint") is False),
            annotations_trusted=trusted,
            pinned=pinned,
        )

    def entity(self) -> dict[str, Any]:
        attrs = {
            "name": self.name,
            "server": self.server,
            "trust": self.trust,
            "read_only": self.read_only,
            "destructive": self.destructive,
            "idempotent": self.idempotent,
            "open_world": self.open_world,
            "annotations_trusted": self.annotations_trusted,
            "pinned": self.pinned,
        }
        return {"uid": _uid("Tool", self.uid), "attrs": attrs, "parents": [_uid("Server", self.server)]}


@dataclass(frozen=True, slots=True)
class Target:
    """The resource of a request: a tool, resource, prompt or server, with its entity attributes."""

    kind: str  # "Tool" | "Resource" | "Prompt" | "Server"
    ident: str
    server: str
    trust: str
    attrs: tuple[tuple[str, Any], ...]
    # Targets key the decision cache on every call: hash them once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.ident, self.server, self.trust, self.attrs)))

    def __hash__(self) -> int:
        return self._hash

    @staticmethod
    def for_tool(facts: ToolFacts) -> "Target":
        entity = facts.entity()
        return Target("Tool", facts.uid, facts.server, facts.trust, tuple(entity["attrs"].items()))

    @staticmethod
    def for_server(name: str, trust: str) -> "Target":
        return Target("Server", name, name, trust, (("trust", trust),))

    @staticmethod
    def for_resource(uri: str, server: str, trust: str) -> "Target":
        return Target("Resource", uri, server, trust, (("uri", uri), ("server", server), ("trust", trust)))

    @staticmethod
    def for_prompt(name: str, server: str, trust: str) -> "Target":
        return Target("Prompt", f"{server}/{name}", server, trust, (("name", name), ("server", server), ("trust", trust)))

    def entities(self) -> list[dict[str, Any]]:
        server = {"uid": _uid("Server", self.server), "attrs": {"trust": self.trust}, "parents": []}
        if self.kind == "Server":
            return [server]
        own = {"uid": _uid(self.kind, self.ident), "attrs": dict(self.attrs), "parents": [_uid("Server", self.server)]}
        return [own, server]


@dataclass(frozen=True, slots=True)
class SessionFacts:
    era: str = "legacy"
    protocol_version: str = ""
    session_id: str = ""
    client_name: str = ""
    tainted_by: tuple[str, ...] = ()  # servers whose content tainted the session, sorted
    # Session facts key the decision cache on every call: hash them once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_hash", hash((self.era, self.protocol_version, self.session_id, self.client_name, self.tainted_by))
        )

    def __hash__(self) -> int:
        return self._hash

    def record(self) -> dict[str, Any]:
        return {
            "era": self.era,
            "protocol_version": self.protocol_version,
            "session_id": self.session_id,
            "client_name": self.client_name,
            "tainted_by": list(self.tainted_by),
        }


_NO_SESSION = SessionFacts()


def argument_tags(arguments: Mapping[str, Any] | None) -> dict[str, str]:
    tags: dict[str, str] = {}
    for key, value in (arguments or {}).items():
        tags[str(key)] = value if isinstance(value, str) else orjson.dumps(value).decode()
    return tags


# --- the engine -----------------------------------------------------------------------------------------


class CedarAuthorizer:
    """Decides requests against a validated policy set, caching decisions by what policies can see."""

    def __init__(self, sources: list[PolicySource], cache_size: int = 8192,
                 claim_attributes: Iterable[str] = ()) -> None:
        if not sources:
            raise PolicyLoadError("no policies: give policy_files or use the default policy")
        self.claim_attributes = check_claim_attributes(claim_attributes)
        schema_text = schema(self.claim_attributes)
        merged: dict[str, Any] = {}
        for source in sources:
            for rule, policy in _validate(source, schema_text).items():
                if rule in merged:
                    raise PolicyLoadError(f"{source.name}: policy id {rule!r} is already used in another file")
                merged[rule] = policy
        self.rules = tuple(merged)
        self._approval_rules = frozenset(
            rule for rule, p in merged.items() if p.get("annotations", {}).get("approval") == "required"
        )
        self._policies = cedarpy.PolicySet.from_json_str(
            json.dumps({"staticPolicies": merged, "templates": {}, "templateLinks": []})
        )
        self._context_used = _context_attributes(merged)
        # Whether some policy's decision can depend on a call's arguments (then decisions vary per call): read at
        # every call, so an attribute, not a property.
        self.reads_arguments = self._reads("arguments")
        self._reads_session = self._reads("session")
        self._principal_read = _principal_attributes(merged, PRINCIPAL_ATTRIBUTES + self.claim_attributes)
        self._cache: OrderedDict[tuple[Any, ...], Decision] = OrderedDict()
        self._cache_size = cache_size

    @staticmethod
    def from_files(paths: Iterable[Path], include_default: bool = False,
                   claim_attributes: Iterable[str] = ()) -> "CedarAuthorizer":
        paths = list(paths)
        return CedarAuthorizer(load_policy_sources(paths, include_default or not paths),
                               claim_attributes=claim_attributes)

    def _reads(self, attribute: str) -> bool:
        return self._context_used is None or attribute in self._context_used

    def authorize(
        self,
        identity: Identity,
        action: str,
        target: Target,
        arguments: Mapping[str, Any] | None = None,
        session: SessionFacts | None = None,
    ) -> Decision:
        session = session or _NO_SESSION
        tags = argument_tags(arguments) if self.reads_arguments else None
        read = self._principal_read
        key = (
            identity.name,
            identity.groups,
            tuple(_principal_value(identity, name) for name in read) if read else None,
            action,
            target,
            tuple(sorted(tags.items())) if tags is not None else None,
            session if self._reads_session else None,
        )
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        decision = self._evaluate(identity, action, target, tags or {}, session)
        self._cache[key] = decision
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return decision

    def principal_entities(self, identity: Identity) -> list[dict[str, Any]]:
        """The caller as Cedar entities: the user, with the attributes policies may read, and its groups."""
        user = {
            "uid": _uid("User", identity.name),
            "attrs": principal_attributes(identity, self.claim_attributes),
            "parents": [_uid("Group", g) for g in identity.groups],
        }
        return [user, *({"uid": _uid("Group", g), "attrs": {}, "parents": []} for g in identity.groups)]

    def is_authorized(self, request: dict[str, Any], entities: list[dict[str, Any]]) -> Any:
        """Cedar's answer to ``request`` under this policy set, with ``entities``."""
        return cedarpy.is_authorized(request, self._policies, entities)

    def _evaluate(
        self, identity: Identity, action: str, target: Target, tags: dict[str, str], session: SessionFacts
    ) -> Decision:
        arguments = {"uid": _uid("Arguments", "call"), "attrs": {}, "parents": [], "tags": tags}
        request = {
            "principal": _uid("User", identity.name),
            "action": _uid("Action", action),
            "resource": _uid(target.kind, target.ident),
            "context": {"arguments": {"__entity": _uid("Arguments", "call")}, "session": session.record()},
        }
        result = self.is_authorized(request, [*self.principal_entities(identity), *target.entities(), arguments])
        reasons = list(result.diagnostics.reasons)
        errors = list(result.diagnostics.errors)
        if result.allowed:
            needs_approval = [r for r in reasons if r in self._approval_rules]
            if needs_approval:
                return Decision(Effect.APPROVAL, needs_approval[0], "a person must approve this call")
            return Decision(Effect.ALLOW, reasons[0] if reasons else "", "permitted by policy")
        if reasons:
            return Decision(Effect.DENY, reasons[0], "forbidden by policy", {"errors": errors} if errors else {})
        return Decision(Effect.DENY, DEFAULT_DENY_RULE, "no policy permits this", {"errors": errors} if errors else {})


def authorize_admin(authorizer: CedarAuthorizer, identity: Identity, action: str, operation: str = "") -> Decision:
    """May ``identity`` do ``action`` (one of ``ADMIN_ACTIONS``) on the console, the act named by ``operation``?
    Not cached: operators act seldom, and every act is decided afresh."""
    if action not in ADMIN_ACTIONS:
        raise ValueError(f"{action!r} is not an operator's action ({', '.join(ADMIN_ACTIONS)})")
    console = {"uid": _uid("Console", "console"), "attrs": {}, "parents": []}
    request = {
        "principal": _uid("User", identity.name),
        "action": _uid("Action", action),
        "resource": _uid("Console", "console"),
        "context": {"operation": operation},
    }
    result = authorizer.is_authorized(request, [*authorizer.principal_entities(identity), console])
    reasons = list(result.diagnostics.reasons)
    if result.allowed:
        return Decision(Effect.ALLOW, reasons[0] if reasons else "", "permitted by policy")
    if reasons:
        return Decision(Effect.DENY, reasons[0], "forbidden by policy")
    return Decision(Effect.DENY, DEFAULT_DENY_RULE, "no policy permits this")


def authorize_server_request(
    authorizer: CedarAuthorizer, identity: Identity, server: str, method: str, trust: str = "untrusted"
) -> Decision:
    """May ``server`` ask ``identity``'s client to answer ``method`` (sampling, elicitation, roots)?"""
    action = SERVER_REQUEST_ACTIONS.get(method)
    if action is None:
        return Decision.deny(DEFAULT_DENY_RULE, "this server request is not allowed")
    return authorizer.authorize(identity, action, Target.for_server(server, trust))
