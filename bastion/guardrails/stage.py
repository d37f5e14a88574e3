"""The guardrails of a ``tools/call``, as two stages of the chain: ``ScreenStage`` before the policy, ``CallStage``
inside it.

Pinning, the metadata scan's refusal of withheld tools and taint recall screen a call before the policy does, in
that order outermost first; as interceptors of their own, each was a layer of the chain, a step and a coroutine
created and resumed for every call, and each read the call's name and looked its tool up. ``ScreenStage`` is one
step for ``tools/call`` that asks each of them in the same order, with nothing to create when none has anything to
wait for: a plain function that hands back the next step's coroutine (the refusals are raised from a coroutine, as
they were).

Confused-deputy links, taint, output injection and secret and personal-data scanning each see a call's answer, in
that order outermost first; as interceptors of their own, each was a coroutine created and resumed for every call,
each decoded (or asked the shared decoder for) the result and walked its strings. ``CallStage`` is one interceptor
for ``tools/call`` that calls each one's plain before and after functions in the same order, around one
``call_next``, with one decode and one list of text slots.

Either way every other method still goes to the guardrails' own interceptors (the chain takes ``tools/call`` off
their routes: ``bastion.guardrails.chain``).

Before any of that, a result that came as the server's bytes is offered to the pre-scan
(``bastion.guardrails.prescan``): one text, nothing that could hide a value, and no detector finding anything in
it, and the bytes go on as they came without being decoded or walked. Which guardrails apply to a server's calls is
worked out once per server (``_Plan``): a running chain's configuration does not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, NoReturn

from bastion.guardrails.content import text_slots
from bastion.guardrails.injection import _call_name as call_name
from bastion.guardrails.injection import finds_any as injection_found
from bastion.guardrails.pinning import _call_name as pinned_name
from bastion.guardrails.prescan import only_text
from bastion.guardrails.deputy import may_hold_reference
from bastion.guardrails.raw import RawResults
from bastion.guardrails.scanning import slots_size
from bastion.model import REQUEST, TAINTED_BY, GatewayError, GatewayRequest, Handler
from bastion.protocol.jsonrpc import RawResponse

if TYPE_CHECKING:
    from bastion.guardrails.deputy import DeputyGuard
    from bastion.guardrails.injection import MetadataGuard, OutputGuard
    from bastion.guardrails.pinning import PinningGuard
    from bastion.guardrails.scanning import ScanningInterceptor
    from bastion.guardrails.taint import TaintGuard, TaintRecall

CALL = "tools/call"
# Results up to this size are pre-scanned (bastion.guardrails.prescan); larger ones take the full path.
PRESCAN_MAX_BYTES = 64 * 1024


class ScreenStage:
    """Pinning, the metadata scan's refusal and taint recall of a ``tools/call``, outermost first, in one step."""

    methods = frozenset({CALL})
    # Only the tool's name, which each guardrail reads from the client's JSON too when the params were left so.
    reads_params = False
    span_name = "guardrails.screen"  # its span, when tracing is on
    reads_results = False

    def __init__(self, *, pinning: PinningGuard | None = None, metadata: MetadataGuard | None = None,
                 recall: TaintRecall | None = None) -> None:
        self._pinning = pinning
        self._gate = metadata._gate if metadata is not None else None  # the refusal of calls to withheld tools
        self._recall = recall

    def __call__(self, request: GatewayRequest, call_next: Handler) -> Awaitable[Any]:
        # A plain function that hands back the next step's coroutine: one of its own only where a guardrail waits
        # (pinning judging a changed catalog, the pins file read again), refuses, or keeps something for after the
        # answer (a 2026-07-28 caller's taint).
        if request.method != CALL:  # ``methods`` says what to look at; a chain built by hand passes everything
            return call_next(request)
        name = request.params.get("name")
        pinning = self._pinning
        if pinning is not None:
            pinned = name if type(name) is str else pinned_name(request.params)
            if not pinning.passes_call(request.catalog, pinned):
                return self._checked(request, call_next, pinned)
        return self._past_pinning(request, call_next, name)

    async def _checked(self, request: GatewayRequest, call_next: Handler, name: str | None) -> Any:
        """Pinning's decision that may wait (and refuse), then the rest of the stage, as its own layer had it."""
        await self._pinning.check_call(request, name)  # type: ignore[union-attr]
        return await self._past_pinning(request, call_next, request.params.get("name"))

    def _past_pinning(self, request: GatewayRequest, call_next: Handler, name: Any) -> Awaitable[Any]:
        gate = self._gate
        if gate is not None:
            refusal = gate.refusal(name if type(name) is str else call_name(request.params))
            if refusal is not None:
                return _raise(refusal)
        recall = self._recall
        # Taint recall's own hook, on its own route: a client's requests.
        if recall is not None and request.kind == REQUEST and request.direction in recall.directions:
            return recall.on_request(request, call_next)
        return call_next(request)


async def _raise(error: GatewayError) -> NoReturn:
    """A refusal decided in a plain function, raised where its layer raised it: when the step's answer is awaited."""
    raise error


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the stage does for one server's calls."""

    output_mode: str  # output_injection's mode for the server ("off" when that guardrail is not in the chain)
    deputy: bool  # resource links to other servers' resources are withheld
    scanning: bool  # secrets and personal data are looked for


class CallStage:
    """Deputy, taint, output injection and scanning of a ``tools/call``, outermost first, in one layer."""

    methods = frozenset({CALL})
    # Only the tool's name, which ``request.target`` (or the raw name) gives.
    reads_params = False
    span_name = "guardrails"  # its span, when tracing is on
    # The result may come as the server's bytes: pre-scanned, or decoded once for every guardrail of the stage, and
    # passed on as those bytes when none of them changed anything (bastion.guardrails.raw).
    reads_results = "raw"

    def __init__(self, *, deputy: DeputyGuard | None = None, taint: TaintGuard | None = None,
                 output: OutputGuard | None = None, scanning: ScanningInterceptor | None = None) -> None:
        self._deputy = deputy
        self._taint = taint
        self._output = output
        self._scanning = scanning
        self._plans: dict[str | None, _Plan] = {}
        self._raw_results = RawResults()
        self.raw_results = self._raw_results

    @property
    def raw_results(self) -> RawResults:
        return self._raw_results

    @raw_results.setter
    def raw_results(self, shared: RawResults) -> None:
        """The chain's one decoder, for the stage and each guardrail in it."""
        self._raw_results = shared
        for part in (self._deputy, self._output, self._scanning):
            if part is not None:
                part.raw_results = shared

    def _plan(self, server: str | None) -> _Plan:
        plan = self._plans.get(server)
        if plan is None:
            output = self._output._mode(server) if self._output is not None else "off"
            deputy = self._deputy is not None and server is not None and self._deputy._mode(server) != "off"
            scanning = self._scanning is not None and self._scanning.scans_for(server)
            plan = self._plans[server] = _Plan(output, deputy, scanning)
        return plan

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        if request.method != CALL:  # ``methods`` says what to look at; a chain built by hand passes everything
            return await call_next(request)
        entry = request.target
        server = entry.server if entry is not None else None
        plan = self._plans.get(server)
        if plan is None:
            plan = self._plan(server)
        taint = self._taint
        if taint is not None and entry is not None:
            known = request.session.facts.get(TAINTED_BY)
            # Only content of another server holds a call: nothing to ask when the call's own server is all there is.
            if known and (len(known) > 1 or server not in known):
                await taint.hold_if_tainted(request, entry)
        try:  # taint's layer: an answer, result or error, reached the session
            output = self._output if plan.output_mode != "off" else None
            try:  # output injection's layer
                try:  # scanning's layer
                    result = await call_next(request)
                except GatewayError as error:
                    if self._scanning is None:
                        raise
                    raise await self._scanning.scanned_error(error, request, server, _scan_target(request)) from None
                if type(result) is RawResponse and self._clean(result, plan):
                    output = None  # nothing either scanner would find: the bytes go on as they came
                else:
                    result, tree, slots, size = await self._scanned(request, result, server)
            except GatewayError as error:
                if output is not None:
                    output.check_error(request, error, call_name(request.params), server, plan.output_mode)
                raise
            if output is not None:
                result = await self._marked(request, result, tree, slots, size, server, plan)
        except GatewayError:
            if taint is not None:
                taint.note_answer(request, server)
            raise
        if taint is not None and server is not None and server not in (request.session.facts.get(TAINTED_BY) or ()):
            if not (isinstance(result, dict) and result.get("resultType") == "input_required"):
                taint.note_answer(request, server)
        if plan.deputy:
            if type(result) is RawResponse:
                if may_hold_reference(result):
                    return self._deputy.withhold_in_raw(request, server, result)  # type: ignore[union-attr]
            elif isinstance(result, dict):
                self._deputy.withhold_foreign_links(request, server, result)  # type: ignore[union-attr, arg-type]
        return result

    def _clean(self, raw: RawResponse, plan: _Plan) -> bool:
        """Whether the pre-scan finds ``raw`` clean for every scanner on for its server. A large result goes to the
        full path at once: its scans cost far more than the stage's layers, and a finding would have it scanned
        twice."""
        if len(raw.result) > PRESCAN_MAX_BYTES:
            return False
        text = only_text(raw.result)
        if text is None:
            return False
        if plan.scanning:
            scanner = self._scanning._scanner.ready()  # type: ignore[union-attr]
            if scanner is None or scanner.finds_any(text):
                return False
        if plan.output_mode != "off" and injection_found(text):
            return False
        return True

    async def _scanned(self, request: GatewayRequest, result: Any, server: str | None) -> tuple[Any, Any, Any, Any]:
        """Scanning's part of an answer: (what it passes on, the decoded tree, its text slots while they still stand
        for what is passed on, and their size)."""
        scanning = self._scanning
        if scanning is None:
            return result, None, None, None
        if type(result) is RawResponse:
            tree = self._raw_results.decode(result)
        elif isinstance(result, dict):
            tree = result
        else:
            return result, None, None, None
        slots = list(text_slots(CALL, tree))
        size = slots_size(slots)
        if await scanning.scan_result(tree, request, server, _scan_target(request), slots, size):
            if result is not tree:
                self._raw_results.changed(result)
            return tree, tree, None, None  # redacted or blocked in place: walked again if read again
        if result is not tree:
            result = self._raw_results.unchanged(result)
        return result, tree, slots, size

    async def _marked(self, request: GatewayRequest, result: Any, tree: Any, slots: Any, size: Any,
                      server: str | None, plan: _Plan) -> Any:
        """Output injection's part of an answer: what it passes on."""
        if type(result) is RawResponse:
            if tree is None:
                tree = self._raw_results.decode(result)
        else:
            if result is not tree:
                slots = size = None
            tree = result
        if not isinstance(tree, dict):
            return result
        answer = await self._output.after_result(  # type: ignore[union-attr]
            request, tree, call_name(request.params), server, plan.output_mode, slots, size)
        if answer is None:
            return self._raw_results.unchanged(result) if result is not tree else result
        if result is not tree:
            self._raw_results.changed(result)
        return answer


def _scan_target(request: GatewayRequest) -> str:
    name = call_name(request.params)
    return f"{CALL} {name}" if isinstance(name, str) else CALL
