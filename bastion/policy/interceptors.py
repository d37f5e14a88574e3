"""The policy interceptor, built from the pure decision functions, and ``build_policy_interceptors``.

One interceptor runs every stage, in order: authorization and list filtering → argument guards → rate
limits → approval → the route to the server; around them all, the audit trail. Each stage appends its
decision to the request's trail, which the audit writes as one ``decision`` line and one ``call`` line
per request. One interceptor rather than one per stage: on the hot path a pipeline step costs more than
most of the checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Awaitable, Callable, ContextManager, Iterable, Mapping

from bastion.model import (
    TAINTED_BY, TO_CLIENT, GatewayError, GatewayRequest, Handler, Identity, Interceptor, Session, ToolEntry,
)
from bastion.policy.approval import (
    APPROVAL_KEY,
    STATE_PREFIX,
    WITHDRAWN,
    ApprovalQueue,
    ApprovalSigner,
    Redeemed,
    approval_elicitation,
    arguments_digest,
    elicitation_approves,
    load_secret,
)
from bastion.policy.audit import AuditWriter, shape_of
from bastion.policy.cedar_engine import SessionFacts, Target, authorize_admin, authorize_server_request
from bastion.policy.config import PolicyConfig, PolicyStartError
from bastion.policy.decision import Decision, Effect
from bastion.policy.engine import SCHEMA_RULE, PolicyEngine
from bastion.policy.ratelimit import RATE_LIMITED, RateLimiter
from bastion.policy.approval_state import UNREACHABLE, StateQueue
from bastion.state import MemoryStore, StateStore, StateUnavailable

log = logging.getLogger("bastion.approval")
refusals = logging.getLogger("bastion.policy")

POLICY_DENIED = -32001
# The audit trail's rule for a call a user approves in their client's own configuration (autoApprove).
CLIENT_CONFIG_RULE = "approval:client-config"
_APPROVED_BY_CLIENT_CONFIG = Decision.allow(
    CLIENT_CONFIG_RULE, "approved in advance by the client's configuration (autoApprove/alwaysAllow)")
ARGUMENT_REFUSED = -32602
_SESSION_FACTS = "bastion.policy.session"  # (the taint record they were built from, the session's facts)
_REMEMBERED = "bastion.policy.approved_tools"
_WHO = "bastion.policy.audit_who"
_SERVER_REQUEST_REFUSED = -32600  # what the server that asked is answered
AUDIT_FAILURE_RULE = "policy.audit.on_failure"  # the rule of a call refused while the audit trail cannot be written
# A client's requests still answered then: its handshake and lists, which act on nothing.
_ANSWERED_UNRECORDED = frozenset({"initialize", "server/discover", "ping", "tools/list", "resources/list",
                                  "resources/templates/list", "prompts/list"})
REUSED_RULE = "approval:reused"  # the audit trail's rule for a call let through by policy.approval.reuse_seconds
_REUSE_KEY = "approval-reuse:"  # a call a person approved, in the shared state, for policy.approval.reuse_seconds
# A call refused because the shared state (bastion/state/) could not be reached to decide it: its own rules in the
# audit trail, so an outage is told apart from limits and refusals.
STATE_UNAVAILABLE = -32000
RATE_STATE_RULE = "rate:state-unavailable"
APPROVAL_STATE_RULE = "approval:state-unavailable"


@dataclass(slots=True)
class Trail:
    """What the policy stages decided about one request."""

    # Each stage as the audit records it: (stage, effect, rule, reason, detail or None).
    stages: list[tuple[str, Effect, str, str, dict[str, object] | None]] = field(default_factory=list)
    approval: Decision | None = None

    def add(self, stage: str, decision: Decision) -> None:
        self.stages.append((stage, decision.effect, decision.rule, decision.reason, decision.detail or None))


def principal_key(identity: Identity) -> str:
    """What tells callers apart where Bastion keeps something per caller (rate-limit buckets, approvals granted):
    the name alone for the configured identity, else name, method and issuer, so that two issuers' "alice" (or an
    API key named like a token's subject) never share one."""
    if identity.authenticated_by == "configured" and identity.issuer is None:
        return identity.name
    return f"{identity.name}\x1f{identity.authenticated_by}\x1f{identity.issuer or ''}"


def session_facts(session: Session) -> SessionFacts:
    kept = session.facts.get(_SESSION_FACTS)
    tainted = session.facts.get(TAINTED_BY)
    # The taint guardrail replaces its record when it grows, so an unchanged one is the same object.
    if kept is not None and kept[0] is tainted:
        return kept[1]  # type: ignore[no-any-return]
    client = (session.client_info or {}).get("name", "") if session.client_info else ""
    facts = SessionFacts(session.era, session.protocol_version, session.session_id, str(client),
                         tuple(sorted(tainted or ())))
    session.facts[_SESSION_FACTS] = (tainted, facts)
    return facts


def taint_note(session: Session, server: str) -> str:
    """What an approval prompt for a call on ``server`` says first: the content of other servers this session read
    that could steer the model (empty when none)."""
    sources = [source for name, source in (session.facts.get(TAINTED_BY) or {}).items() if name != server]
    if not sources:
        return ""
    return ("This session has read content that could steer the model: "
            + "; ".join(source.describe() for source in sources) + ".")


def _reuse_key(key: tuple[str, str, str]) -> str:
    """The shared state's key for a call a person approved (caller, tool, arguments digest), of one fixed size."""
    return _REUSE_KEY + hashlib.sha256("\x1e".join(key).encode()).hexdigest()


def _refusal(code: int, message: str, decision: Decision) -> GatewayError:
    return GatewayError(code, message, {"rule": decision.rule, "reason": decision.reason})


def state_refusal(trail: "Trail", stage: str, rule: str, what: str, name: str,
                  error: StateUnavailable) -> GatewayError:
    """A call that needs the shared state to be decided, refused when it cannot be reached (fail closed): the
    message says so, and that the call was not run; the next call tries the store again."""
    decision = Decision.deny(rule, f"{what}: {error}")
    trail.add(stage, decision)
    return _refusal(STATE_UNAVAILABLE, f"Call to '{name}' was not run: {what}, because {error}; retry when it is "
                                       "back", decision)


class InputInvalid(GatewayError):
    """Arguments that do not fit the tool's input schema. The specification (2025-11-25, SEP-1303) makes this a tool
    execution error, not a protocol error, so that the model reads what was wrong and can call again."""

    def tool_result(self) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": self.message}], "isError": True}


def _lookup(catalog: Any, kind: str, key: str) -> Any:
    finder = getattr(catalog, kind, None)
    return finder(key) if callable(finder) else None


class AuditTrail:
    """Hands each request's facts to the audit writer, which builds the records.

    With ``refuse`` (``policy.audit.on_failure = "refuse"``), a request that comes while the writer says the trail
    cannot be written is refused before it reaches a server or a client; only a client's handshake, ping and lists
    are still answered (they act on nothing; a client that starts meanwhile still learns its tools, and why each call
    is refused).
    """

    def __init__(self, writer: AuditWriter | None, record_values: bool, refuse: bool = False) -> None:
        self.writer = writer
        self._record_values = record_values
        self.refuse = refuse and writer is not None

    def refusal(self, request: GatewayRequest, trail: Trail) -> GatewayError | None:
        """The error that refuses a request now, when the trail cannot be written and the setting says refuse."""
        why = self.writer.failure  # type: ignore[union-attr]
        if why is None or (request.method in _ANSWERED_UNRECORDED and request.direction != TO_CLIENT):
            return None
        decision = Decision.deny(AUDIT_FAILURE_RULE, f'{why}, and {AUDIT_FAILURE_RULE} is "refuse"')
        trail.add("audit", decision)
        return _refusal(POLICY_DENIED, f'Refused: {why}, and {AUDIT_FAILURE_RULE} = "refuse" lets nothing run '
                        "unrecorded; calls run again once the trail can be written", decision)

    def hand_over(self, request: GatewayRequest, trail: Trail, outcome: Any, latency_ns: int) -> None:
        """Only what is cheap happens here; the audit sealer turns these facts into the records."""
        session = request.session
        who = session.facts.get(_WHO)
        if who is None:
            who = {**session.identity.record(), "session": session.session_id}
            session.facts[_WHO] = who
        params = request.params
        method = request.method
        arguments = params.get("arguments") or {} if method == "tools/call" else None
        shape_them = not self._record_values
        # Serialised now, so what is recorded is what the call carried; effects are str enums. A server's request to a
        # client is recorded under the server that asked.
        target = request.server if request.direction == TO_CLIENT else params.get("name") or params.get("uri")
        facts = (time.time(), who, method, target, arguments, shape_them, outcome, latency_ns, trail.stages)
        try:
            self.writer.write_call(facts)  # type: ignore[union-attr]
        except TypeError:
            # Values JSON cannot hold (never from a parsed request): their shape, taken here.
            shaped = shape_of(arguments) if shape_them else {"unrecordable": shape_of(arguments)}
            self.writer.write_call((*facts[:4], shaped, False, *facts[6:]))  # type: ignore[union-attr]

    async def aclose(self) -> None:
        if self.writer is not None:
            await self.writer.aclose()


class AuthorizationStage:
    """Cedar authorization; hides from lists what the principal may not use."""

    def __init__(self, engine: PolicyEngine) -> None:
        self.engine = engine

    def _authorize(self, request: GatewayRequest, action: str, target: Target) -> Decision:
        return self.engine.authorizer.authorize(
            request.session.identity, action, target, None, session_facts(request.session)
        )

    def check_call(self, request: GatewayRequest, entry: ToolEntry, trail: Trail) -> None:
        """Refuse a ``tools/call`` the policies forbid; note one that needs a person's approval."""
        decision = self.engine.authorize_call(
            request.session.identity, entry, request.params.get("arguments"), session_facts(request.session)
        )
        trail.add("authorization", decision)
        effect = decision.effect
        if effect is Effect.DENY:
            raise _refusal(POLICY_DENIED, f"Call to '{entry.exposed_name}' refused by policy", decision)
        if effect is Effect.APPROVAL:
            trail.approval = decision

    async def handle(self, request: GatewayRequest, trail: Trail, call_next: Handler) -> dict[str, Any]:
        """Any request but ``tools/call``: gate reads of resources and prompts, filter lists."""
        method = request.method
        if method == "tools/list":
            return self._filter_tools(request, await call_next(request))
        if method == "resources/read":
            uri = str(request.params.get("uri", ""))
            self._gate(request, trail, "read_resource", self._resource_target(request, uri))
        elif method == "prompts/get":
            name = str(request.params.get("name", ""))
            self._gate(request, trail, "get_prompt", self._prompt_target(request, name))
        result = await call_next(request)
        if method == "resources/list":
            return self._filter(result, "resources", lambda item: self._visible(
                request, "read_resource", self._resource_target(request, str(item.get("uri", "")))))
        if method == "prompts/list":
            return self._filter(result, "prompts", lambda item: self._visible(
                request, "get_prompt", self._prompt_target(request, str(item.get("name", "")))))
        return result

    def _gate(self, request: GatewayRequest, trail: Trail, action: str, target: Target) -> None:
        decision = self._authorize(request, action, target)
        trail.add("authorization", decision)
        if decision.effect is Effect.DENY:
            raise _refusal(POLICY_DENIED, "Request refused by policy", decision)
        if decision.effect is Effect.APPROVAL:
            trail.approval = decision

    def _visible(self, request: GatewayRequest, action: str, target: Target) -> bool:
        listing = {"call_tool": "list_tools", "read_resource": "list_resources", "get_prompt": "list_prompts"}[action]
        server = Target.for_server(target.server, target.trust)
        if self._authorize(request, listing, server).effect is Effect.DENY:
            return False
        return self._authorize(request, action, target).effect is not Effect.DENY

    def _filter_tools(self, request: GatewayRequest, result: dict[str, Any]) -> dict[str, Any]:
        def visible(item: Mapping[str, Any]) -> bool:
            entry = request.catalog.tool(str(item.get("name", "")))
            return entry is not None and self._visible(request, "call_tool", self.engine.tool_target(entry))

        return self._filter(result, "tools", visible)

    @staticmethod
    def _filter(result: dict[str, Any], key: str, visible: Callable[[Mapping[str, Any]], bool]) -> dict[str, Any]:
        items = result.get(key)
        if not isinstance(items, list):
            return result
        kept = [item for item in items if isinstance(item, Mapping) and visible(item)]
        return result if len(kept) == len(items) else {**result, key: kept}

    @staticmethod
    def _resource_target(request: GatewayRequest, uri: str) -> Target:
        owner = _lookup(request.catalog, "resource_owner", uri)
        server = str(owner) if owner else ""
        return Target.for_resource(uri, server, _server_trust(request.catalog, server))

    @staticmethod
    def _prompt_target(request: GatewayRequest, name: str) -> Target:
        found = _lookup(request.catalog, "prompt", name)
        server = str(getattr(found, "server", "")) if found is not None else ""
        original = str(getattr(found, "original", name)) if found is not None else name
        return Target.for_prompt(original, server, _server_trust(request.catalog, server))


def _server_trust(catalog: Any, server: str) -> str:
    """A server's trust level; the catalog view only exposes it on tool entries."""
    declared = _lookup(catalog, "server_trust", server)
    if isinstance(declared, str):
        return declared
    for entry in catalog.tools():
        if entry.server == server:
            return entry.server_trust
    return "untrusted"


class ArgumentGuards:
    """Input-schema validation and argument guards for ``tools/call``."""

    def __init__(self, engine: PolicyEngine) -> None:
        self.engine = engine

    def check(self, request: GatewayRequest, entry: ToolEntry, trail: Trail) -> None:
        decision = self.engine.check_arguments(entry, request.params.get("arguments") or {})
        trail.add("guards", decision)
        if decision.effect is Effect.DENY:
            message = f"Arguments refused by policy: {decision.reason}"
            if decision.rule == SCHEMA_RULE:
                raise InputInvalid(ARGUMENT_REFUSED, message, {"rule": decision.rule, "reason": decision.reason})
            raise _refusal(ARGUMENT_REFUSED, message, decision)


class RateLimits:
    """Token buckets; over the limit the answer is -32000 with ``data.retryAfterSeconds``. The buckets are in the
    state store: one that cannot be reached refuses the call (-32000, rule ``rate:state-unavailable``)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def check(self, request: GatewayRequest, entry: ToolEntry, trail: Trail) -> None:
        identity = request.session.identity
        try:
            verdict = await self.limiter.check(identity.name, entry.server, entry.original_name,
                                               principal_key(identity))
        except StateUnavailable as error:
            raise state_refusal(trail, "rate_limit", RATE_STATE_RULE, "its rate limits could not be checked",
                                str(request.params.get("name") or entry.original_name), error) from None
        if verdict.allowed:
            return
        decision = Decision.deny(verdict.rule, "rate limit exceeded", retryAfterSeconds=verdict.retry_after_seconds)
        trail.add("rate_limit", decision)
        raise GatewayError(
            RATE_LIMITED,
            "Rate limit exceeded; retry later",
            {"retryAfterSeconds": verdict.retry_after_seconds, "rule": verdict.rule},
        )


def log_refusal(request: GatewayRequest, trail: Trail) -> None:
    """One line per request the policy refused, naming the caller, what it asked and the rule; never arguments."""
    stage, _, rule, reason, _ = trail.stages[-1]
    target = request.params.get("name") or request.params.get("uri") or ""
    refusals.info("refused %s %s for %s: %s rule %s (%s)", request.method, target,
                  request.session.identity.describe(), stage, rule or "-", reason)


class PolicyInterceptor:
    """The audit trail around authorization, argument guards, rate limits and approval, as one pipeline step: a hook
    for every request, both ways.

    A client's ``tools/call`` — the hot path — passes the first three stages as plain calls; other client requests go
    through authorization's gates and list filters, then approval. A server's request to a client (sampling,
    elicitation, roots) is authorized for the server that asks and the client it would reach, and audited in the
    same records as a call; one Bastion answers itself (``answered_by_bastion``) asks no client and is not
    authorized: a method relayed to no client is audited with its answer, -32601, and a server's ping passes
    unrecorded. Notifications decide nothing here: the policy has no hook for them.
    """

    # A call's result is read only for its outcome ("complete", or a 2026-07-28 server's "input_required", which the
    # gateway decodes before it gets here): it may stay the server's bytes, so the default configuration keeps the
    # byte pass-through of results. A call's arguments are read (Cedar, the guards, the schema check, the audit).
    reads_results = "raw"
    span_name = "policy"  # its span, when tracing is on

    def __init__(
        self,
        audit: AuditTrail,
        authorization: AuthorizationStage,
        guards: ArgumentGuards,
        rate_limits: RateLimits | None,
        approval: "ApprovalStage",
    ) -> None:
        self.audit = audit
        self.authorization = authorization
        self.guards = guards
        self.rate_limits = rate_limits
        self.approval = approval
        # Told each request's stages once decided (the metrics' decisions by rule); None costs a request nothing.
        self.decided: Callable[[list[Any]], None] | None = None

    async def on_request(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        if request.answered_by_bastion and request.method == "ping":
            # A server's keep-alive, which Bastion answers itself: nothing to decide, and a record per ping would
            # flood the trail.
            return await call_next(request)
        trail = Trail()
        started = time.perf_counter_ns()
        outcome: Any = "error"
        try:
            if self.audit.refuse:
                refused = self.audit.refusal(request, trail)
                if refused is not None:
                    raise refused
            if request.direction == TO_CLIENT:
                result = await self._server_request(request, trail, call_next)
            else:
                result = await self._decide_and_call(request, trail, call_next)
            if request.continues:
                outcome = "continued"
                return result
            outcome = result.get("resultType", "complete") if isinstance(result, dict) else "complete"
            return result
        except InputInvalid as invalid:
            outcome = invalid.code
            log_refusal(request, trail)
            return invalid.tool_result()
        except GatewayError as error:
            outcome = error.code
            if trail.stages and trail.stages[-1][1] is Effect.DENY:
                log_refusal(request, trail)
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if self.audit.writer is not None:
                self.audit.hand_over(request, trail, outcome, time.perf_counter_ns() - started)
            if self.decided is not None:
                self.decided(trail.stages)

    def _server_request(self, request: GatewayRequest, trail: Trail, call_next: Handler) -> Awaitable[dict[str, Any]]:
        if request.answered_by_bastion:
            # A method Bastion relays to no client: no client is asked, so nothing is authorized; its last step
            # answers the server -32601, and the call record says so.
            return call_next(request)
        server = request.server or ""
        decision = authorize_server_request(self.authorization.engine.authorizer, request.session.identity, server,
                                            request.method, _server_trust(request.catalog, server))
        trail.add("authorization", decision)
        if decision.effect is Effect.DENY:
            raise _refusal(_SERVER_REQUEST_REFUSED,
                           f"{request.method} from server {server!r} refused by policy: {decision.reason}", decision)
        return call_next(request)

    def _decide_and_call(self, request: GatewayRequest, trail: Trail, call_next: Handler) -> Awaitable[dict[str, Any]]:
        if request.method != "tools/call":
            return self.authorization.handle(request, trail, partial(self.approval.run, trail=trail, call_next=call_next))
        entry = request.target
        if entry is not None:  # else the route answers "unknown tool": nothing to decide
            self.authorization.check_call(request, entry, trail)
            self.guards.check(request, entry, trail)
            if self.rate_limits is not None and not request.continues:
                return self._limited(request, entry, trail, call_next)
        return self._approved(request, entry, trail, call_next)

    async def _limited(self, request: GatewayRequest, entry: ToolEntry, trail: Trail,
                       call_next: Handler) -> dict[str, Any]:
        # A coroutine only under rate limits: the buckets are the state store's, which may be a round trip away.
        await self.rate_limits.check(request, entry, trail)  # type: ignore[union-attr]
        return await self._approved(request, entry, trail, call_next)

    def _approved(self, request: GatewayRequest, entry: ToolEntry | None, trail: Trail,
                  call_next: Handler) -> Awaitable[dict[str, Any]]:
        # A retry that continues a call was approved with that call, if it needed a person.
        if trail.approval is None or request.continues:
            return call_next(request)
        return self.approval.run(request, trail, call_next, entry)


class ApprovalStage:
    """Asks a person before calls a policy marked ``@approval("required")``.

    One approval is one execution: a person's yes runs the call it was asked about once. A 2026-07-28 approval
    (``requestState``) is redeemed once, in the gateway's shared state, whatever the connection or replica it comes
    to; a handshake-era prompt's answer and a queue request each settle the one call that asked. When that call's
    server (of the 2026-07-28 era) asks for input of its own, the rounds that follow continue the approved call:
    the server's state travels inside one of Bastion's, each good for its next round once. The identical call sent
    again is asked about again, unless ``policy.approval.reuse_seconds`` opts in to letting it through for a while
    (or ``remember = "session"`` for the rest of a handshake-era session).

    Whatever the route, a call that waits for a person says so at once: the client gets a progress
    notification (when the call carries a progress token) or a warning log message naming the approval
    request and the command that settles it, and the gateway logs the same at WARNING.
    """

    def __init__(
        self,
        config: PolicyConfig,
        signer: ApprovalSigner,
        queue: ApprovalQueue | StateQueue | None,
        pre_approved: Mapping[str, Iterable[str]] | None = None,
        state: StateStore | None = None,
    ) -> None:
        self.settings = config.approval
        self.signer = signer
        self.queue = queue
        # Tools a user already approves in their client (autoApprove / alwaysAllow), by server.
        self._pre_approved = {server: frozenset(names) for server, names in (pre_approved or {}).items() if names}
        # Where calls a person approved are kept for policy.approval.reuse_seconds (nothing when it is 0).
        self._state = state if state is not None else MemoryStore()
        self._reuse = self.settings.reuse_seconds
        self._approver = self.settings.approver
        self._queue_as_fallback = self.settings.fallback == "queue"
        # What watches a wait for a person (a span, when the composition root turns tracing on): nothing by default.
        self.watch: Callable[..., ContextManager[Any]] = _unwatched
        self.waiting = 0  # calls waiting for a person now

    @property
    def state(self) -> StateStore:
        """Where used approvals are kept (the readiness check asks it)."""
        return self._state

    def client_approves(self, session: Session) -> bool:
        """Whether the client may be asked to approve (policy.approval.approver): never out of band, and under auto
        only a client on stdio, where a person sits at it; over HTTP the client is most often an agent, which would
        approve its own call."""
        return self._approver == "client" or (self._approver == "auto" and not session.over_network)

    def run(
        self, request: GatewayRequest, trail: Trail, call_next: Handler, entry: ToolEntry | None = None
    ) -> Awaitable[dict[str, Any]]:
        """Pass the request on when no policy asked for approval, or when the client's configuration approves the
        tool in advance; otherwise ask, then pass it on or refuse. A plain function: a call the client's
        configuration approves in advance costs no coroutine here."""
        if trail.approval is None:
            return call_next(request)
        if entry is not None and entry.original_name in self._pre_approved.get(entry.server, ()):
            trail.add("approval", _APPROVED_BY_CLIENT_CONFIG)
            return call_next(request)
        return self._ask(request, trail, call_next, entry)

    async def _ask(
        self, request: GatewayRequest, trail: Trail, call_next: Handler, entry: ToolEntry | None
    ) -> dict[str, Any]:
        session = request.session
        name = str(request.params.get("name") or request.params.get("uri") or "")
        server = entry.server if entry else ""
        label = entry.original_name if entry else name  # the server's own name for it, shown to the person
        arguments = request.params.get("arguments")
        if name in session.facts.get(_REMEMBERED, ()):
            trail.add("approval", Decision.allow("approval:remembered", "approved earlier in this session"))
            return await call_next(request)
        # Hashed only past the checks above, which pass most calls (those the client's configuration approves).
        key = (principal_key(session.identity), name, arguments_digest(arguments))

        state = request.params.get("requestState")
        if session.era == "modern" and isinstance(state, str) and state.startswith(STATE_PREFIX):
            # A state is good once, reuse window or not: a replay is refused, never run.
            return await self._redeem(request, call_next, trail, key, name, state)
        if self._reuse and await self._reused(trail, key, name):
            trail.add("approval", Decision.allow(
                REUSED_RULE, f"a person approved the identical call less than {self._reuse:g} s ago "
                             "(policy.approval.reuse_seconds)"))
            return await call_next(request)
        by_client = self.client_approves(session)
        if by_client and session.era == "modern" and session.client_capabilities.get("elicitation") is not None:
            trail.add("approval", Decision(Effect.APPROVAL, trail.approval.rule, "asked the person (input_required)"))
            params = approval_elicitation(server, label, arguments, self.settings.show_argument_values, True,
                                          taint_note(session, server), session.identity.describe())
            return {
                "resultType": "input_required",
                "inputRequests": {APPROVAL_KEY: {"method": "elicitation/create", "params": params}},
                "requestState": self.signer.issue(*key),
            }
        ask_client = by_client and session.era != "modern" and session.client is not None and \
            session.client.supports("elicitation")
        if ask_client or (self.queue is not None and (self._queue_as_fallback or not by_client)):
            problem = await self._wait_for_person(request, trail, server, label, arguments, ask_client)
            return await self._settle(request, call_next, trail, key, name, problem)
        decision = Decision.deny(trail.approval.rule, "needs approval and the client cannot ask the person")
        trail.add("approval", decision)
        raise _refusal(
            POLICY_DENIED,
            f"'{name}' needs a person's approval, and this client cannot ask for it "
            "(set policy.approval.fallback = \"queue\" to approve it with `bastion approve`)",
            decision,
        )

    async def ask_out_of_band(self, request: GatewayRequest, entry: ToolEntry, question: str) -> str | None:
        """A guardrail's question about a call (taint, a value's flow) that the client cannot be asked: the call
        waits in the approval queue, said at once as a policy approval's wait is, until `bastion approve` or `deny`
        settles it or it times out. None when a person approved, else why not."""
        if self.queue is None or not (self._queue_as_fallback or not self.client_approves(request.session)):
            return ("no person could be asked: the client does not take elicitation requests, and "
                    "policy.approval.fallback = \"refuse\" keeps calls out of the approval queue")
        return await self._wait_for_person(request, Trail(), entry.server, entry.original_name,
                                           request.params.get("arguments"), False, question)

    async def _reused(self, trail: Trail, key: tuple[str, str, str], name: str) -> bool:
        """Whether a person approved the identical call within policy.approval.reuse_seconds; a store that cannot
        say refuses the call rather than ask again a person who may have said yes on another replica."""
        try:
            return await self._state.recorded(_reuse_key(key))
        except StateUnavailable as error:
            raise state_refusal(trail, "approval", APPROVAL_STATE_RULE, "its approval could not be looked up", name,
                                error) from None

    async def _redeem(
        self, request: GatewayRequest, call_next: Handler, trail: Trail, key: tuple[str, str, str], name: str,
        state: str,
    ) -> dict[str, Any]:
        """A retry bringing one of Bastion's states: the person's answer to the approval it asked for, or the next
        round of a call approved already. Either way the state is used up here, before anything runs: a store that
        cannot be reached to use it up refuses the call (never run unapproved, nor twice across replicas)."""
        try:
            redeemed: Redeemed = await self.signer.redeem(state, *key)
        except StateUnavailable as error:
            raise state_refusal(trail, "approval", APPROVAL_STATE_RULE, "its approval could not be used up", name,
                                error) from None
        responses = request.params.get("inputResponses")
        # Neither Bastion's state nor its question goes to the server; a continued round's answers are the server's.
        params = {k: v for k, v in request.params.items() if k != "requestState"}
        if redeemed.problem is not None or not redeemed.continuing:
            answer = responses.get(APPROVAL_KEY) if isinstance(responses, Mapping) else None
            problem = redeemed.problem
            if problem is None and not elicitation_approves(answer):
                problem = "the person declined"
            params.pop("inputResponses", None)
            return await self._settle(dataclasses.replace(request, params=params), call_next, trail, key, name,
                                      problem)
        if redeemed.server_state is not None:
            params["requestState"] = redeemed.server_state
        rule = trail.approval.rule if trail.approval else "approval"
        trail.add("approval", Decision.allow(rule, "the next round of a call a person approved"))
        return await self._run_approved(dataclasses.replace(request, params=params), call_next, key)

    async def _settle(
        self,
        request: GatewayRequest,
        call_next: Handler,
        trail: Trail,
        key: tuple[str, str, str],
        name: str,
        problem: str | None,
    ) -> dict[str, Any]:
        rule = trail.approval.rule if trail.approval else "approval"
        if problem is not None:
            decision = Decision.deny(rule, f"approval refused: {problem}")
            trail.add("approval", decision)
            raise _refusal(POLICY_DENIED, f"Call to '{name}' was not approved: {problem}", decision)
        trail.add("approval", Decision.allow(rule, "approved by a person"))
        if self._reuse:
            try:
                await self._state.claim(_reuse_key(key), self._reuse)
            except StateUnavailable as error:
                # The person's yes stands (it runs this call once); only the grant for identical calls is lost, so
                # the next one asks again.
                log.warning("approval of %s not kept for policy.approval.reuse_seconds: %s", name, error)
        if self.settings.remember == "session":
            request.session.facts.setdefault(_REMEMBERED, set()).add(name)
        return await self._run_approved(request, call_next, key)

    async def _run_approved(self, request: GatewayRequest, call_next: Handler,
                            key: tuple[str, str, str]) -> dict[str, Any]:
        """Run the call a person approved. If its server (of the 2026-07-28 era) answers ``input_required``, the
        state it gave goes inside one of Bastion's, bound to the call and good for its next round once, so that the
        client's retry continues this call without asking the person again."""
        result = await call_next(dataclasses.replace(request, person_approved=True))
        if isinstance(result, dict) and result.get("resultType") == "input_required" \
                and request.session.era == "modern":
            state = self.signer.issue(*key, continuing=True, server_state=result.get("requestState"))
            result = {**result, "requestState": state}
        return result

    async def _wait_for_person(
        self, request: GatewayRequest, trail: Trail, server: str, label: str, arguments: Any, ask_client: bool,
        question: str | None = None,
    ) -> str | None:
        """Ask in the client, in the queue, or both (the first answer counts); None when a person approved."""
        self.waiting += 1
        try:
            return await self._wait_for_answer(request, trail, server, label, arguments, ask_client, question)
        finally:
            self.waiting -= 1

    async def _wait_for_answer(
        self, request: GatewayRequest, trail: Trail, server: str, label: str, arguments: Any, ask_client: bool,
        question: str | None,
    ) -> str | None:
        session = request.session
        timeout = self.settings.timeout_seconds
        approval_id = None
        if self.queue is not None:
            record = {
                "identity": session.identity.name,
                "groups": list(session.identity.groups),
                "who": session.identity.record(),
                "session": session.session_id,
                "method": request.method,
                "server": server,
                "tool": label,
                "arguments": arguments if self.settings.show_argument_values else shape_of(arguments),
            }
            note = question or taint_note(session, server)
            if note:
                record["note"] = note
            try:
                approval_id = await self._submit(record, timeout)
            except StateUnavailable as exc:
                log.warning("%s/%s: the approval queue cannot be reached: %s", server, label, exc)
                if not ask_client:  # fails closed: nobody could be asked, so nobody approves
                    return f"the approval queue cannot be reached, so nobody can approve it ({exc})"
        wait = ApprovalWait(server, label, approval_id, self._command(approval_id), ask_client, timeout,
                            session.identity.describe())
        log.warning("%s", wait.sentence())
        announce_wait(request, wait)
        asks: dict[str, asyncio.Future[Any]] = {}
        if ask_client:
            asks["client"] = asyncio.ensure_future(self._ask_legacy(session, server, label, arguments))
        if approval_id is not None and self.queue is not None:
            asks["queue"] = asyncio.ensure_future(self.queue.wait(approval_id, timeout, self.settings.poll_seconds))
        with self.watch("approval wait", **{"bastion.server": server, "bastion.asked_in": "+".join(asks)}):
            try:
                await asyncio.wait(asks.values(), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                trail.add("approval", Decision.deny(trail.approval.rule if trail.approval else "approval",
                                                    f"withdrawn: the client cancelled the call{wait.reference()}"))
                log.info("%s/%s: %s's client withdrew the call%s", server, label, wait.who, wait.reference())
                raise
            finally:
                await self._stop_asking(asks, approval_id)
        problem = self._outcome(asks, wait)
        if problem is None:
            log.info("%s/%s approved for %s%s", server, label, wait.who, wait.reference())
        else:
            # Nobody answering is what a person may not have noticed; a refusal was their own doing.
            level = logging.WARNING if problem.startswith("timed out") else logging.INFO
            log.log(level, "%s/%s not approved for %s%s: %s", server, label, wait.who, wait.reference(), problem)
        return problem

    async def _submit(self, record: Mapping[str, Any], timeout: float) -> str:
        """Queue a request; one the client withdraws while it is being written is marked withdrawn at once."""
        assert self.queue is not None
        submitting = asyncio.ensure_future(self.queue.submit_async(record, timeout))
        try:
            return await asyncio.shield(submitting)
        except asyncio.CancelledError:
            try:
                approval_id = await submitting
                await self.queue.close_request_async(approval_id, WITHDRAWN, "the client withdrew the call")
            except StateUnavailable:
                pass  # nothing to mark, or it lapses as orphaned: nobody waits for it either way
            raise

    async def _stop_asking(self, asks: Mapping[str, asyncio.Future[Any]], approval_id: str | None) -> None:
        """Cancel the ask that did not answer; an answer in the client closes the queue request as answered."""
        client = asks.get("client")
        queue = self.queue
        if approval_id is not None and queue is not None and client is not None and client.done() \
                and not client.cancelled():
            status = "approved" if client.exception() is None and client.result() is None else "denied"
            try:
                await queue.close_request_async(approval_id, status, "answered in the client")
            except StateUnavailable as exc:  # the person's answer stands; the request lapses as orphaned
                log.warning("approval %s was answered in the client, but its queue request cannot be closed: %s",
                            approval_id, exc)
        for ask in asks.values():
            ask.cancel()
        await asyncio.gather(*asks.values(), return_exceptions=True)

    @staticmethod
    def _outcome(asks: Mapping[str, asyncio.Future[Any]], wait: "ApprovalWait") -> str | None:
        client = asks.get("client")
        if client is not None and client.done() and not client.cancelled():
            return client.result()
        status = asks["queue"].result()
        if status == "approved":
            return None
        if status == "denied":
            return f"denied in the approval queue{wait.reference()}"
        if status == UNREACHABLE:
            return f"the approval queue in the shared state store could not be reached until the timeout{wait.reference()}"
        return f"timed out: nobody approved it within {wait.timeout_seconds:g} s{wait.reference()}"

    def _command(self, approval_id: str | None) -> str | None:
        if approval_id is None or self.queue is None:
            return None
        return self.queue.command(approval_id)

    async def _ask_legacy(self, session: Session, server: str, name: str, arguments: Any) -> str | None:
        with_mode = session.protocol_version >= "2025-11-25"
        params = approval_elicitation(server, name, arguments, self.settings.show_argument_values, with_mode,
                                      taint_note(session, server), session.identity.describe())
        try:
            answer = await asyncio.wait_for(
                session.client.request("elicitation/create", params), self.settings.timeout_seconds  # type: ignore[union-attr]
            )
        except asyncio.TimeoutError:
            return f"timed out: nobody answered the prompt within {self.settings.timeout_seconds:g} s"
        except GatewayError as error:
            return f"the client could not ask ({error.message})"
        return None if elicitation_approves(answer) else "the person declined"


def _unwatched(name: str, **attributes: Any) -> ContextManager[None]:
    return nullcontext()


@dataclass(frozen=True, slots=True)
class ApprovalWait:
    """One call waiting for a person: what the client and the log are told."""

    server: str
    tool: str
    approval_id: str | None  # the queue request, when there is a queue
    command: str | None  # what approves it from a shell
    in_client: bool  # the client was asked too
    timeout_seconds: float
    who: str = ""  # the caller asking, as Identity.describe() says it

    def reference(self) -> str:
        return f" (approval {self.approval_id})" if self.approval_id else ""

    def sentence(self) -> str:
        call = f"'{self.tool}' on server '{self.server}'" if self.server else f"'{self.tool}'"
        if self.who:
            call += f", called by {self.who},"
        if self.command and self.in_client:
            how = f"answer the prompt in the client, or run `{self.command}`"
        elif self.command:
            how = f"run `{self.command}` to allow it (or `bastion deny {self.approval_id}`)"
        else:
            how = "answer the prompt in the client"
        return (f"{call} is waiting for a person's approval{self.reference()}: {how}; "
                f"it is refused after {self.timeout_seconds:g} s")

    def log_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"message": self.sentence(), "server": self.server, "tool": self.tool,
                                "timeoutSeconds": self.timeout_seconds}
        if self.who:
            data["caller"] = self.who
        if self.approval_id is not None:
            data["approvalId"] = self.approval_id
            data["command"] = self.command
        return data


_LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def announce_wait(request: GatewayRequest, wait: ApprovalWait) -> None:
    """Tell the client at once that its call waits for a person: progress when it asked for progress, else a
    warning log message if the request takes log messages (a 2026-07-28 request opts in by its log level)."""
    client = request.session.client
    if client is None:
        return
    meta = request.params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, Mapping) else None
    if token is not None:
        client.notify("notifications/progress", {"progressToken": token, "progress": 0, "message": wait.sentence()})
        return
    threshold = request.log_level
    if threshold is not None and _LOG_LEVELS.index("warning") >= (
            _LOG_LEVELS.index(threshold) if threshold in _LOG_LEVELS else 0):
        client.notify("notifications/message", {"level": "warning", "logger": "bastion", "data": wait.log_data()})


@dataclass
class PolicyRuntime:
    """The interceptors plus what the gateway needs besides them (server-request hook, shutdown)."""

    engine: PolicyEngine
    interceptors: list[Interceptor]
    audit: AuditTrail
    approval: "ApprovalStage | None" = None
    state: StateStore | None = None  # where used approvals and rate limits' buckets are kept: handed to a reload's

    def record_admission_refusal(self, identity: Identity, method: str, target: str | None, stage: str, rule: str,
                                 reason: str, outcome: int) -> None:
        """A request the HTTP frontend refused before it reached the chain (a method's scope, a server's in-flight
        gate), audited in the same records as a call: who, what, and the stage that refused it."""
        writer = self.audit.writer
        if writer is None:
            return
        who = identity.record()
        stages = [(stage, Effect.DENY, rule, reason, None)]
        writer.write_call((time.time(), who, method, target, None, False, outcome, 0, stages))

    def authorize_server_request(self, identity: Identity, server: str, method: str, trust: str = "untrusted") -> Decision:
        """The decision alone (``bastion policy`` and tests); the gateway asks the policy interceptor's hook, which
        audits it."""
        return authorize_server_request(self.engine.authorizer, identity, server, method, trust)

    def authorize_admin(self, identity: Identity, action: str, operation: str = "") -> Decision:
        """May ``identity`` read the metrics or the console, or do ``operation`` from it (``cedar_text.ADMIN_ACTIONS``)?"""
        return authorize_admin(self.engine.authorizer, identity, action, operation)

    def record_admin_action(self, identity: Identity, operation: str, target: str | None, decision: Decision,
                            outcome: int = 0) -> None:
        """An operator's act (or its refusal), audited in the same records as a call: who, ``admin/OPERATION``, on
        what, and the policy's decision."""
        writer = self.audit.writer
        if writer is None:
            return
        stages = [("authorization", decision.effect, decision.rule, decision.reason, None)]
        writer.write_call((time.time(), identity.record(), f"admin/{operation}", target, None, False, outcome, 0,
                           stages))

    def tell_decisions(self, decided: Callable[[list[Any]], None]) -> None:
        """Have each request's stages told to ``decided`` once decided (the metrics count them by rule)."""
        for interceptor in self.interceptors:
            if isinstance(interceptor, PolicyInterceptor):
                interceptor.decided = decided

    async def aclose(self) -> None:
        await self.audit.aclose()


def _secret(path: str | None, setting: str) -> bytes:
    try:
        return load_secret(path)
    except (OSError, ValueError) as error:
        raise PolicyStartError(
            f"{path}: cannot use it as a key ({error}); fix {setting}, or delete the file to have a new key made"
        ) from None


def build_policy_runtime(
    config: PolicyConfig,
    *,
    engine: PolicyEngine | None = None,
    audit_writer: AuditWriter | None = None,
    clock: Callable[[], float] = time.monotonic,
    pinned: Callable[[ToolEntry], bool] | None = None,
    pre_approved: Mapping[str, Iterable[str]] | None = None,
    claim_attributes: Iterable[str] = (),
    shared_state: StateStore | None = None,
    config_file: str | None = None,
) -> PolicyRuntime:
    """The policy interceptor and its parts; ``pre_approved`` maps a server to the tools (its own names) a user
    already approves in their client, which the approval stage lets through without asking; ``claim_attributes``
    are the principal attributes ``auth.claims.attributes`` names; ``shared_state`` is where used approvals (and
    calls approved within ``policy.approval.reuse_seconds``) are kept: this process's memory unless given one that
    replicas share (``clock``, the monotonic clock, times the memory's records and the rate limits' buckets). The
    rate limits' buckets are in that store, keyed by their limit: a reload that keeps a limit keeps its buckets (and
    one that changes it starts fresh ones), with nothing handed over. With a store replicas share, the approval
    queue is kept there too (approval_state.py), and ``config_file`` is the configuration its wait message names."""
    engine = engine or PolicyEngine(config, pinned=pinned, claim_attributes=claim_attributes)
    writer = audit_writer
    if writer is None and config.audit.enabled:
        key = _secret(config.audit.key_file, "audit.key_file") if config.audit.key_file else None
        writer = AuditWriter(config.audit.path, config.audit.rotate_bytes, key)
    audit = AuditTrail(writer, config.audit.arguments == "values", config.audit.on_failure == "refuse")
    state = shared_state if shared_state is not None else MemoryStore(clock)
    secret = _secret(config.approval.secret_file, "approval.secret_file")
    signer = ApprovalSigner(secret, config.approval.timeout_seconds, state)
    # A call approved out of band waits in the queue whatever the fallback says.
    queued = config.approval.fallback == "queue" or config.approval.approver != "client"
    queue = approval_queue(config.approval.queue_dir, state, config_file) if queued else None
    limiter = RateLimiter(config.rate_limits, state) if config.rate_limits else None
    limits = RateLimits(limiter) if limiter is not None else None
    approval = ApprovalStage(config, signer, queue, pre_approved, state)
    policy = PolicyInterceptor(audit, AuthorizationStage(engine), ArgumentGuards(engine), limits, approval)
    return PolicyRuntime(engine, [policy], audit, approval, state)


def approval_queue(directory: str, state: StateStore, config_file: str | None = None) -> ApprovalQueue | StateQueue:
    """The queue of ``policy.approval.queue_dir``, or with a ``state`` store replicas share, the queue in it (any
    replica lists and settles any replica's requests; ``config_file`` names the configuration in the command it
    tells a person to run)."""
    return StateQueue(state, config_file=config_file) if state.shared else ApprovalQueue(directory)


def build_policy_interceptors(config: PolicyConfig, **options: Any) -> list[Interceptor]:
    """The policy interceptors in order (one); flush the audit trail at shutdown with ``PolicyRuntime.aclose``."""
    return build_policy_runtime(config, **options).interceptors
