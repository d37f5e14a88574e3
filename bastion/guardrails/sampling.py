"""Sampling guardrails: a server's ``sampling/createMessage`` spends the user's model and feeds server text to it.

A request passes when a call of the same client to the same server is in flight (never unsolicited, never
inside another server's call: the gateway lists only the asking server's own calls), when it is within the
budgets (requests per call, requests and tokens per minute for each server and client), and when an untrusted
server does not ask for context (``includeContext`` other than ``"none"``). On the way, ``maxTokens`` is capped,
the model preferences are limited, and the system prompt and messages are scanned for instructions to the model
as results are (marked as untrusted data, or refused, by the server's ``output_injection`` switch). Each check is a pure function; ``SamplingGuard`` applies them and answers
a refused request with a JSON-RPC error the server can read.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from bastion.guardrails.config import GuardrailsConfig, SamplingSettings
from bastion.guardrails.content import text_slots
from bastion.guardrails.injection import INJECTION_FLAGS, Verdict, mark_untrusted, scan_slots
from bastion.guardrails.remembered import client_of, key as state_key, unreachable
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import CallInFlight, CatalogView, GatewayError, GatewayRequest, Handler
from bastion.state import MemoryStore, StateStore, StateUnavailable

log = logging.getLogger("bastion.guardrails")

SAMPLING = "sampling/createMessage"
# The JSON-RPC error a refused sampling request is answered with: the request itself is not acceptable.
SAMPLING_REFUSED = -32600
_WINDOW_SECONDS = 60.0
# Model preferences an untrusted server may state: how to weigh cost, speed and capability, never which model.
_PRIORITIES = ("costPriority", "speedPriority", "intelligencePriority")
_MAX_HINTS = 4
_MAX_HINT_CHARS = 100


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a sampling request is refused: the rule that refused it and words for the server and the log."""

    rule: str
    kind: str
    reason: str
    retry_after_seconds: float | None = None

    def error(self, server: str) -> GatewayError:
        data: dict[str, Any] = {"guardrail": "sampling", "rule": self.rule}
        if self.retry_after_seconds is not None:
            data["retryAfterSeconds"] = round(self.retry_after_seconds, 3)
        return GatewayError(SAMPLING_REFUSED, f"sampling/createMessage from server {server!r} refused by Bastion: "
                            f"{self.reason}", data)


# ------------------------------------------------------------------------------------------ pure checks
def check_origin(server: str, calls: Sequence[CallInFlight]) -> Refusal | None:
    """A server may sample only while one of this client's calls to it is in flight."""
    if calls:
        return None
    return Refusal("origin", "unsolicited",
                   f"it came while no call of this client to {server!r} was in flight; a server may ask for sampling "
                   "only while it works on one of the client's calls")


def check_include_context(params: Mapping[str, Any], trust: str) -> Refusal | None:
    """``includeContext`` other than ``"none"`` asks the client to add conversation context: trusted servers only."""
    asked = params.get("includeContext")
    if asked in (None, "none") or trust == "trusted":
        return None
    return Refusal("include-context", "include-context",
                   f"includeContext {asked!r} would give a {trust} server the conversation; only trusted servers may "
                   "ask for context (send includeContext \"none\")")


def requested_tokens(params: Mapping[str, Any]) -> int | None:
    value = params.get("maxTokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def cap_max_tokens(params: dict[str, Any], limit: int) -> tuple[dict[str, Any], int | None]:
    """``params`` with ``maxTokens`` at most ``limit`` (set to it when missing or not a positive integer), and the
    value asked for when it was changed."""
    asked = requested_tokens(params)
    if asked is not None and asked <= limit:
        return params, None
    return {**params, "maxTokens": limit}, asked if asked is not None else -1


def limit_model_preferences(preferences: Any, trusted: bool) -> tuple[Any, bool]:
    """Model preferences as the client should see them: priorities kept within 0..1, model hints (which model to
    use) only from trusted servers and only a few short ones, nothing else; and whether anything was changed."""
    if preferences is None:
        return None, False
    if not isinstance(preferences, Mapping):
        return None, True
    limited: dict[str, Any] = {}
    for key in _PRIORITIES:
        value = preferences.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            limited[key] = min(1.0, max(0.0, float(value))) if not 0 <= value <= 1 else value
    hints = preferences.get("hints")
    if trusted and isinstance(hints, list):
        kept = [{"name": h["name"]} for h in hints[:_MAX_HINTS]
                if isinstance(h, Mapping) and isinstance(h.get("name"), str) and len(h["name"]) <= _MAX_HINT_CHARS]
        if kept:
            limited["hints"] = kept
    return limited, limited != dict(preferences)


@dataclass(slots=True)
class _Calls:
    """One client's sampling from one server, per call in flight: kept in this process, where the call runs (a
    server asks for sampling over the connection of the replica that sent it the call)."""

    per_call: dict[Any, int] = field(default_factory=dict)
    last_used: float = 0.0


class SamplingLedger:
    """The budgets of ``SamplingSettings`` per (client, server): requests per call here, where the call runs;
    requests a minute (a sliding window) and tokens a minute (counted per minute of ``clock``) in the gateway's
    store, so that replicas sharing it share them."""

    def __init__(self, store: StateStore, settings: SamplingSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._calls: dict[tuple[str, str], _Calls] = {}

    async def admit(self, client: str, server: str, calls: Sequence[CallInFlight], tokens: int) -> Refusal | None:
        """Count one request of ``tokens`` (its capped ``maxTokens``) against the budgets, or say which it would
        exceed (nothing is counted then), or that the store cannot be asked (fails closed: the request is refused)."""
        now = self._clock()
        self._forget_idle(now)
        spending = self._calls.setdefault((client, server), _Calls())
        spending.last_used = now
        settings = self._settings.for_server(server)
        call = calls[-1].request_id if calls else None
        live = {c.request_id for c in calls}
        spending.per_call = {key: n for key, n in spending.per_call.items() if key in live}
        if spending.per_call.get(call, 0) >= settings.requests_per_call:
            return Refusal("requests-per-call", "over-budget",
                           f"it is request {spending.per_call.get(call, 0) + 1} within one call, over the budget of "
                           f"{settings.requests_per_call} (guardrails.sampling_budget.requests_per_call)")
        try:
            refusal = await self._spend(client, server, settings, tokens, now)
        except StateUnavailable as error:
            refusal = Refusal("state-unavailable", "state-unavailable",
                              f"{unreachable(error)} to count it against the budgets (guardrails.sampling_budget)")
        if refusal is None:
            spending.per_call[call] = spending.per_call.get(call, 0) + 1
        return refusal

    async def _spend(self, client: str, server: str, settings: Any, tokens: int, now: float) -> Refusal | None:
        """The minute's tokens, then the minute's requests, in the store: tokens given back when the requests
        refuse, so that a refused request spends nothing."""
        minute = math.floor(now / _WINDOW_SECONDS)
        spent_key = f"{state_key('sampling-tokens', client, server)}:{minute}"
        if await self._store.add(spent_key, tokens, limit=settings.tokens_per_minute,
                                 seconds=2 * _WINDOW_SECONDS) is None:
            return Refusal("tokens-per-minute", "over-budget",
                           f"{tokens} more tokens would pass the budget of {settings.tokens_per_minute} a minute "
                           "(guardrails.sampling_budget.tokens_per_minute)",
                           max(0.0, (minute + 1) * _WINDOW_SECONDS - now))
        wait = await self._store.hit(state_key("sampling-requests", client, server), settings.requests_per_minute,
                                     _WINDOW_SECONDS)
        if wait == 0:
            return None
        if tokens:
            await self._store.add(spent_key, -tokens, seconds=2 * _WINDOW_SECONDS)
        return Refusal("requests-per-minute", "over-budget",
                       f"over the budget of {settings.requests_per_minute} requests a minute "
                       "(guardrails.sampling_budget.requests_per_minute)", wait)

    def _forget_idle(self, now: float) -> None:
        idle = [key for key, s in self._calls.items() if s.last_used <= now - _WINDOW_SECONDS]
        for key in idle:
            del self._calls[key]


# ------------------------------------------------------------------------------------------ the interceptor
Scanner = Callable[[GatewayRequest], None]


def server_trust(catalog: CatalogView, server: str) -> str:
    """A server's configured trust level; the catalog knows it per server, older views only on tool entries."""
    declared = getattr(catalog, "server_trust", None)
    trust = declared(server) if callable(declared) else None
    if isinstance(trust, str):
        return trust
    for entry in catalog.tools():
        if entry.server == server:
            return entry.server_trust
    return "untrusted"


class SamplingGuard:
    """Checks every ``sampling/createMessage`` a server sends toward a client, in the order origin, context,
    budget; then caps and limits what it asks before the client sees it."""

    methods = frozenset({SAMPLING})
    reads_results = False

    def __init__(self, config: GuardrailsConfig, report: InterventionLog, ledger: SamplingLedger,
                 scanners: Sequence[Scanner] = ()) -> None:
        self._config = config
        self._report = report
        self._ledger = ledger
        # Scanners of what the model would read (the system prompt and messages), as results are scanned; each
        # may rewrite the params in place or raise GatewayError.
        self._scanners = tuple(scanners)

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        server = request.server
        if request.method != SAMPLING or server is None or self._config.switch("sampling", server) == "off":
            return await call_next(request)
        trust = server_trust(request.catalog, server)
        params = request.params if isinstance(request.params, dict) else {}
        limit = self._config.sampling_budget.for_server(server).max_tokens
        refusal = check_origin(server, request.calls_in_flight) or check_include_context(params, trust)
        if refusal is None:
            tokens = min(requested_tokens(params) or limit, limit)
            refusal = await self._ledger.admit(client_of(request), server, request.calls_in_flight, tokens)
        if refusal is not None:
            if refusal.rule == "state-unavailable":
                log.warning("sampling request from server '%s' refused: %s", server, refusal.reason)
            self._tell(request, "refused", refusal.kind, refusal.rule, refusal.reason)
            raise refusal.error(server)
        params, asked = cap_max_tokens(params, limit)
        if asked is not None:
            self._tell(request, "capped", "max-tokens", "max-tokens",
                       f"maxTokens {asked if asked > 0 else '(missing)'} capped to {limit}")
        if "modelPreferences" in params:
            preferences, changed = limit_model_preferences(params["modelPreferences"], trust == "trusted")
            if changed:
                params = {k: v for k, v in params.items() if k != "modelPreferences"}
                if preferences:
                    params["modelPreferences"] = preferences
                self._tell(request, "limited", "model-preferences", "model-preferences",
                           "model preferences limited to priorities within 0..1"
                           + ("" if trust == "trusted" else "; model hints dropped from a server not trusted"))
        if params is not request.params:
            request.params = params
        for scan in self._scanners:
            scan(request)
        return await call_next(request)

    def _tell(self, request: GatewayRequest, action: str, kind: str, rule: str, detail: str) -> None:
        self._report.report(Intervention("sampling", action, request.server, SAMPLING, kind, rule, detail,
                                         request.session.session_id, request.session.identity))


def injection_scan(config: GuardrailsConfig, report: InterventionLog) -> Scanner:
    """The system prompt and messages of a sampling request scanned for instructions to the model as results are,
    with the server's ``output_injection`` switch: marked as untrusted data, or the request refused; either way the
    session is flagged, so the server's content taints it."""

    def scan(request: GatewayRequest) -> None:
        server = request.server
        mode = config.switch("output_injection", server)
        if mode == "off" or not isinstance(request.params, dict):
            return
        flagged = scan_slots(list(text_slots(SAMPLING, request.params)))
        if not flagged:
            return
        verdict = Verdict(tuple(finding for each in flagged for finding in each.verdict.findings))
        request.session.facts.setdefault(INJECTION_FLAGS, {})[server or "?"] = verdict.reason()
        where = ", ".join(each.slot.where for each in flagged)
        rules = ",".join(verdict.rules)
        if mode == "block":
            report.report(Intervention("output_injection", "refused", server, SAMPLING, verdict.kind, rules,
                                       f"{where} read as instructions to the model",
                                       request.session.session_id, request.session.identity))
            raise Refusal("injection", verdict.kind, f"{where} reads as instructions to the model ({verdict.reason()})"
                          ).error(server or "?")
        for each in flagged:
            each.slot.replace(mark_untrusted(each.slot.text, f"server {server!r} (a sampling request)", each.verdict))
        report.report(Intervention("output_injection", "marked", server, SAMPLING, verdict.kind, rules,
                                   f"marked as untrusted data: {where}",
                                   request.session.session_id, request.session.identity))

    return scan


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView,
          state: StateStore | None = None) -> SamplingGuard | None:
    """``state``: where the budgets are counted (the gateway's store; a store of its own without one)."""
    if not config.on_anywhere("sampling"):
        return None
    scanners = [injection_scan(config, report)] if config.on_anywhere("output_injection") else []
    ledger = SamplingLedger(state or MemoryStore(), config.sampling_budget)
    return SamplingGuard(config, report, ledger, scanners=scanners)
