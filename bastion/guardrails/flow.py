"""What a call sends a server: a credential in its arguments, or a value that came from another server's answers.

Two checks of a ``tools/call``'s arguments, before the call reaches its server:

- **Secrets** (``argument_secrets``): the secret detectors of the result scanner (bastion/guardrails/secrets.py),
  run over the arguments as JSON text. A key, token or private key on its way to a server is either what the user
  meant (a tool that takes an API key) or the model handing it out: a person decides, or the call is refused.
- **Flow** (``flow``): distinctive values (taint.py says which: long, letters and digits, high entropy) seen in a
  server's answers are remembered per caller, hashed (``ValueMemory``); a call to *another* server whose arguments
  carry one is held as a tainted call is. A value the user typed was in no answer and passes; a value the called
  server itself gave passes.

The switch that decides is the called server's. Both read the arguments as the JSON text the client sent (no
decoding when they came as bytes) and an answer as the JSON text the server sent: one regular-expression pass each.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import msgspec
import orjson

from bastion.guardrails.config import GuardrailsConfig, Switch
from bastion.guardrails.remembered import unreachable
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.guardrails.scanning import ScannerInBackground
from bastion.guardrails.taint import (
    TAINT_REFUSED,
    VALUE_RUN,
    ClientApproves,
    ValueMemory,
    OutOfBand,
    answering_server,
    ask_someone,
    claims_open_world,
    content_origin,
    distinctive_values,
    named,
)
from bastion.model import CatalogView, GatewayError, GatewayRequest, Handler, ToolEntry
from bastion.protocol.jsonrpc import RawResponse
from bastion.state import MemoryStore, StateStore, StateUnavailable

log = logging.getLogger("bastion.guardrails")

_CALL = "tools/call"
_ANSWERS = frozenset({_CALL, "resources/read", "prompts/get"})


def normalized_json(value: Any) -> bytes:
    """``value`` (decoded, or the JSON bytes it came as) as JSON text with every string written one way: a value
    escaped as ``\\u0041`` in one message and written plainly in another reads the same."""
    if type(value) is msgspec.Raw:
        value = bytes(value)
    if isinstance(value, (bytes, bytearray)):
        if b"\\u" not in value:
            return bytes(value)
        value = orjson.loads(value)
    return orjson.dumps(value)


class FlowGuard:
    """Secrets in a call's arguments and values flowing between servers, held or refused per the called server."""

    methods = _ANSWERS
    reads_params = False  # the arguments are read as the client's JSON text, decoded only when escaped
    reads_results = False  # an answer is read as the server's JSON text
    span_name = "guardrails.flow"  # its span, when tracing is on

    def __init__(self, config: GuardrailsConfig, report: InterventionLog, scanner: ScannerInBackground | None,
                 memory: ValueMemory) -> None:
        self._config = config
        self._report = report
        self._scanner = scanner
        self._memory = memory
        self._secrets = Switch(config, "argument_secrets")
        self._flow = Switch(config, "flow")
        self._remembers = config.on_anywhere("flow")  # values are remembered only for a check that reads them
        self.out_of_band: OutOfBand | None = None  # the approval queue, when the policy has one
        self.client_approves: ClientApproves | None = None  # the policy's approver setting, when there is a policy

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        sent: list[bytes] = []
        if request.method == _CALL:
            arguments = request.params.get("arguments")
            # Nothing to look at unless the arguments hold a run of 12 or more token characters with a letter and a
            # digit: every distinctive value is one, and so is nearly every secret the detectors know (most calls stop
            # here, after one pass of one expression).
            text = bytes(arguments) if type(arguments) is msgspec.Raw else normalized_json(arguments)
            if b"\\u" in text:  # escaped as the client chose: read as written plainly
                text = normalized_json(text)
            if VALUE_RUN.search(text) is not None:
                entry = request.target
                if entry is None and type(request.params.get("name")) is msgspec.Raw:  # the client's JSON, undecoded
                    entry = request.catalog.tool(named(request.params, "name") or "")
                if entry is not None:
                    sent = await self._check(request, entry, text)
        result = await call_next(request)
        if self._remembers:
            await self._note(request, result, sent)
        return result

    # ------------------------------------------------------------------------------------------ arguments
    async def _check(self, request: GatewayRequest, entry: ToolEntry, text: bytes) -> list[bytes]:
        """Hold or refuse the call whose arguments are ``text`` (raises the refusal); the distinctive values they
        carry."""
        sent = distinctive_values(text)
        secrets_mode = self._secrets(entry.server)
        if secrets_mode != "off" and self._scanner is not None:
            kinds = await self._secret_kinds(text)
            if kinds:
                why = f"its arguments carry a secret ({', '.join(kinds)}) for server '{entry.server}'"
                await self._hold(request, entry, secrets_mode, "argument_secrets", "secret-in-arguments", why,
                                 {"kinds": kinds})
        flow_mode = self._flow(entry.server) if sent and sends_out(request.catalog, entry) else "off"
        if flow_mode != "off":
            try:
                sources = await self._memory.sources(request.session.identity, sent, entry.server)
            except StateUnavailable as error:
                why = (f"its arguments carry values for server '{entry.server}' that may have come from another "
                       f"server's answers, and {unreachable(error)} to tell")
                log.warning("flow: %s", why)
                await self._hold(request, entry, flow_mode, "flow", "state-unavailable", why, {})
                return sent
            if sources:
                named = ", ".join(f"'{server}' ({count} value{'s' if count > 1 else ''})"
                                  for server, count in sorted(sources.items()))
                why = (f"its arguments carry values that came from the answers of another server: {named}, now sent "
                       f"to server '{entry.server}'")
                await self._hold(request, entry, flow_mode, "flow", "cross-server-flow", why,
                                 {"from": sorted(sources)})
        return sent

    async def _secret_kinds(self, text: bytes) -> list[str]:
        scanner = self._scanner.ready() or await self._scanner.get()  # type: ignore[union-attr]
        if not scanner.finds_any(text):
            return []
        found = scanner.find_in(text.decode("utf-8", "replace"))
        return sorted({detector.kind for detector, _ in found if detector.guardrail == "secrets"})

    async def _hold(self, request: GatewayRequest, entry: ToolEntry, mode: str, guardrail: str, kind: str, why: str,
                    data: dict[str, Any]) -> None:
        """Ask a person (``approve``) or refuse (``refuse``, or nobody to ask): raises the refusal."""
        if mode == "refuse":
            problem: str | None = f'guardrails.{guardrail} is "refuse" for this server'
        elif guardrail == "flow" and (request.person_approved or entry.pre_approved):
            # The person approved these very arguments (the policy's prompt shows them), or approves the tool in
            # their client already: a value passed on is no news to them. A secret is always asked about.
            why_not = "a person approved the call" if request.person_approved else \
                "approved in advance by the client's file (autoApprove/alwaysAllow)"
            self._tell(request, "approved", entry, guardrail, kind, f"{why_not}: {why}")
            return
        else:
            question = (f"{why[0].upper()}{why[1:]}. Allow the tool '{entry.original_name}' on server "
                        f"'{entry.server}' to run with them?")
            problem = await ask_someone(self._config, request, entry, question, self.out_of_band,
                                          self.client_approves)
        if problem is None:
            self._tell(request, "approved", entry, guardrail, kind, f"a person approved the call: {why}")
            return
        self._tell(request, "refused", entry, guardrail, kind, f"{why}: {problem}")
        raise GatewayError(TAINT_REFUSED, f"Call to '{entry.exposed_name}' refused: {why}: {problem}",
                           {"guardrail": guardrail, "rule": kind, **data})

    def _tell(self, request: GatewayRequest, action: str, entry: ToolEntry, guardrail: str, kind: str,
              detail: str) -> None:
        mode = (self._secrets if guardrail == "argument_secrets" else self._flow)(entry.server)
        self._report.report(Intervention(guardrail, action, entry.server, entry.exposed_name, kind,
                                         f"{guardrail}-{mode}", detail, request.session.session_id,
                                         request.session.identity))

    # ------------------------------------------------------------------------------------------ answers
    async def _note(self, request: GatewayRequest, result: Any, sent: list[bytes]) -> None:
        """Remember the distinctive values of an answer, for the caller, under the server that gave them; not those
        the call itself sent (a server echoing what it was given did not give it). An answer whose values cannot be
        remembered is withheld: the calls it would feed could not be checked."""
        if type(result) is RawResponse:
            text = bytes(result.result)
            if b"\\u" in text:
                text = normalized_json(text)
        elif isinstance(result, dict):
            text = orjson.dumps(result)
        else:
            return
        if VALUE_RUN.search(text) is None:
            return
        values = distinctive_values(text)
        if sent and values:
            echoed = set(sent)
            values = [value for value in values if value not in echoed]
        if values:
            server = answering_server(request)
            if server is not None:
                try:
                    await self._memory.note(request.session.identity, server, values)
                except StateUnavailable as error:
                    self._withhold(request, server, unreachable(error))

    def _withhold(self, request: GatewayRequest, server: str, why: str) -> NoReturn:
        log.warning("flow: %s; an answer of server '%s' is withheld", why, server)
        self._report.report(Intervention("flow", "refused", server, request.method, "state-unavailable",
                                         "flow-state", why, request.session.session_id, request.session.identity))
        raise GatewayError(TAINT_REFUSED, f"The answer of server '{server}' was withheld: it carries values whose "
                           f"flow to other servers is checked, and {why} to remember them; try again when it is back",
                           {"guardrail": "flow", "rule": "state-unavailable"})


def sends_out(catalog: CatalogView, entry: ToolEntry) -> bool:
    """Whether a value handed to ``entry`` can leave the machine: its server reaches the network or the open world
    (or the user marked it), or the tool says it does. A value passed between local servers (a path from the
    filesystem server given to git) goes nowhere else."""
    return content_origin(catalog, entry.server) is not None or claims_open_world(entry.definition)


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView,
          state: StateStore | None = None) -> FlowGuard | None:
    """``state``: where the values are remembered (the gateway's store; a store of its own without one)."""
    secrets, flow = config.on_anywhere("argument_secrets"), config.on_anywhere("flow")
    if not secrets and not flow:
        return None
    return FlowGuard(config, report, ScannerInBackground() if secrets else None,
                     ValueMemory(state or MemoryStore(), config.cross_server.taint_memory_seconds))
