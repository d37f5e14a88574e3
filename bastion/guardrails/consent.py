"""Consent requests: a server's ``elicitation/create`` puts a form or a question in front of a person.

Two abuses of it, neither of which a scan of the words alone stops (the injection scan of the message is the output
guard's, as for every request toward a client):

- **consent fatigue**: a server that asks again and again until the person clicks "accept" without reading. Each
  server may ask each client at most ``max_requests`` times per ``window_seconds``; past that a request is refused to
  the server with a JSON-RPC error saying when it may ask again, and never reaches the person.
- **asking for secrets**: a form with a ``password``, ``api_key`` or card-number field, or a message asking to "enter
  your password". The protocol says servers must not request sensitive information through a form (the URL mode
  exists for that), so such a request is refused (``secrets = "refuse"``), or passed with a warning the person reads
  first (``"flag"``), or left alone (``"off"``). A URL-mode elicitation sends the person to a page of the server's
  own, which is where the specification wants secrets entered, so it is not refused for that.

Each check is a pure function; ``ConsentGuard`` applies them, budget first, and reports every refusal and warning.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from bastion.guardrails.config import ElicitationSettings, GuardrailsConfig
from bastion.guardrails.remembered import client_of, key, unreachable
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import CatalogView, GatewayError, GatewayRequest, Handler
from bastion.state import MemoryStore, StateStore, StateUnavailable

log = logging.getLogger("bastion.guardrails")

ELICITATION = "elicitation/create"
# The request itself is not acceptable, as for a refused sampling request.
ELICITATION_REFUSED = -32600

# What a form field asks for when it asks for a secret: its name, title or description says so.
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase|code)|passwort|kennwort|wachtwoord|contrase[ñn]a|mot[ _-]?de[ _-]?passe|senha"
    r"|\bpin\b|\bsecrets?\b|api[ _-]?key|apikey|access[ _-]?key|private[ _-]?key|\btoken\b"
    r"|auth(?:orization)?[ _-]?code|credentials?|client[ _-]?secret|credit[ _-]?card|card[ _-]?(?:number|no)"
    r"|\bcvv\b|\bcvc\b|security[ _-]?code|\bssn\b|social[ _-]?security|\biban\b|routing[ _-]?number"
    r"|account[ _-]?number|\botp\b|one[ _-]?time[ _-]?(?:code|password)|2fa|mfa|verification[ _-]?code"
    r"|seed[ _-]?phrase|recovery[ _-]?(?:phrase|code)|mnemonic|wallet[ _-]?key"
)
_SECRET_FIELD = re.compile(_SECRET_WORDS, re.IGNORECASE)
# A message that asks the person to hand over a secret: a verb of giving, then the secret within a few words.
_SECRET_ASK = re.compile(
    r"\b(?:enter|provide|type|paste|give|share|send|submit|input|confirm|re-?enter|supply|tell us)\b[^.?!\n]{0,40}?"
    r"(?:" + _SECRET_WORDS + r")", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: str
    reason: str
    retry_after_seconds: float | None = None

    def error(self, server: str) -> GatewayError:
        data: dict[str, Any] = {"guardrail": "elicitation", "rule": self.rule}
        if self.retry_after_seconds is not None:
            data["retryAfterSeconds"] = round(self.retry_after_seconds, 3)
        return GatewayError(ELICITATION_REFUSED, f"elicitation/create from server {server!r} refused by Bastion: "
                            f"{self.reason}", data)


# ------------------------------------------------------------------------------------------ pure checks
def secret_fields(params: Mapping[str, Any]) -> list[str]:
    """The fields of a form-mode request's ``requestedSchema`` that ask for a secret (by name, title, description or
    ``format: "password"``), then "message" when the message asks for one; empty for a URL-mode request."""
    if params.get("mode") == "url":
        return []
    found = [name for name, spec in _properties(params.get("requestedSchema")) if _asks_secret(name, spec)]
    message = params.get("message")
    if isinstance(message, str) and _SECRET_ASK.search(_plain(message)):
        found.append("message")
    return found


def _properties(schema: Any) -> Iterator[tuple[str, Any]]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(properties, Mapping):
        yield from ((str(name), spec) for name, spec in properties.items())


def _asks_secret(name: str, spec: Any) -> bool:
    texts = [name]
    if isinstance(spec, Mapping):
        if spec.get("format") == "password" or spec.get("writeOnly") is True:
            return True
        texts.extend(value for key in ("title", "description") if isinstance(value := spec.get(key), str))
    # "user_password" and "apiKey" too: split snake and camel case into words first.
    return any(_SECRET_FIELD.search(re.sub(r"(?<=[a-z])(?=[A-Z])|_", " ", _plain(text))) for text in texts)


_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u2060-\u2064\ufeff]")


def _plain(text: str) -> str:
    """``text`` as a person reads it: fullwidth and other compatibility forms folded (``ｐａｓｓｗｏｒｄ``),
    invisible characters taken out (``pass\u200bword``), so a field cannot hide what it asks for from the check."""
    return _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))


class ConsentLedger:
    """How often each server asked each client within the window: a sliding window per (client, server) in the
    gateway's store (so that replicas sharing it share the budget), which forgets it a window after the last."""

    def __init__(self, store: StateStore, settings: ElicitationSettings) -> None:
        self._store = store
        self._settings = settings

    async def admit(self, client: str, server: str) -> Refusal | None:
        """Count one request, or say it is over the budget (nothing is counted then), or that the store cannot be
        asked (fails closed: the request is refused)."""
        limit, window = self._settings.for_server(server)
        try:
            wait = await self._store.hit(key("consent", client, server), limit, window)
        except StateUnavailable as error:
            return Refusal("state-unavailable", f"{unreachable(error)} to count it against the budget "
                           "(guardrails.consent.max_requests)")
        if wait == 0:
            return None
        return Refusal("requests-per-window",
                       f"it is over the budget of {limit} within {window:g} s (guardrails.consent.max_requests and "
                       "window_seconds): asking a person again and again wears their judgement down", wait)


def secrets_refusal(fields: list[str]) -> Refusal:
    return Refusal("asks-for-secret",
                   f"it asks for what reads as a secret ({', '.join(fields)}); a server must not ask for passwords, "
                   "keys, tokens or card numbers in a form (use a URL-mode elicitation to a page of its own), or set "
                   "guardrails.consent.secrets = \"flag\" to let a person decide")


def warned(message: Any, server: str, fields: list[str]) -> str:
    """The message with a warning a person reads before the server's words."""
    words = message if isinstance(message, str) else ""
    return (f"[Bastion: server {server!r} asks for what reads as a secret ({', '.join(fields)}). Do not enter "
            f"passwords, keys or card numbers here unless you trust this server with them.]\n{words}")


# ------------------------------------------------------------------------------------------ the interceptor
class ConsentGuard:
    """Holds every ``elicitation/create`` a server sends toward a client to its budget and its secrets setting."""

    methods = frozenset({ELICITATION})
    reads_results = False

    def __init__(self, config: GuardrailsConfig, report: InterventionLog, ledger: ConsentLedger) -> None:
        self._config = config
        self._report = report
        self._ledger = ledger

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        server = request.server
        if request.method != ELICITATION or server is None or self._config.switch("elicitation", server) == "off":
            return await call_next(request)
        params = request.params if isinstance(request.params, dict) else {}
        refusal = await self._ledger.admit(client_of(request), server)
        if refusal is not None:
            if refusal.rule == "state-unavailable":
                log.warning("elicitation from server '%s' refused: %s", server, refusal.reason)
            self._tell(request, "refused", "over-budget" if refusal.rule != "state-unavailable" else
                       "state-unavailable", refusal.rule, refusal.reason)
            raise refusal.error(server)
        mode = self._config.consent.secrets
        fields = secret_fields(params) if mode != "off" else []
        if fields and mode == "refuse":
            refusal = secrets_refusal(fields)
            self._tell(request, "refused", "asks-for-secret", refusal.rule, f"fields: {', '.join(fields)}")
            raise refusal.error(server)
        if fields:
            request.params = {**params, "message": warned(params.get("message"), server, fields)}
            self._tell(request, "flagged", "asks-for-secret", "asks-for-secret", f"fields: {', '.join(fields)}")
        return await call_next(request)

    def _tell(self, request: GatewayRequest, action: str, kind: str, rule: str, detail: str) -> None:
        self._report.report(Intervention("elicitation", action, request.server, ELICITATION, kind, rule, detail,
                                         request.session.session_id, request.session.identity))


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView,
          state: StateStore | None = None) -> ConsentGuard | None:
    """``state``: where the budgets are counted (the gateway's store; a store of its own without one)."""
    if not config.on_anywhere("elicitation"):
        return None
    return ConsentGuard(config, report, ConsentLedger(state or MemoryStore(), config.consent))
