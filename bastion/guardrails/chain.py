"""The guardrail interceptors a configuration asks for, in the order the chain needs them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial, update_wrapper
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.raw import RawResults
from bastion.guardrails.report import InterventionLog
from bastion.model import CatalogView, Interceptor
from bastion.state import MemoryStore, StateStore

if TYPE_CHECKING:
    from bastion.guardrails.taint import ClientApproves, OutOfBand

# The first guardrail sees a client's request first and the result last. Pinning and metadata scanning decide what
# is served at all, so they screen requests before the policy does: a person is never asked to approve a call to a
# tool that would be refused as changed or poisoned. The taint a 2026-07-28 caller's earlier requests left is recalled
# there too, so that the policy sees it as a session's own. The others sit inside the policy and see only what it
# permits; the scanners of results sit innermost, so a result is redacted before it is marked and before taint is
# recorded from it. For a tools/call each group is one stage (``screened``, ``staged``).
Builder = Callable[[GuardrailsConfig, InterventionLog, CatalogView], "Interceptor | None"]


def given(builder: Callable[..., "Interceptor | None"], **values: Any) -> Builder:
    """``builder`` with some of its arguments given, still named as itself (bench/guardrails.py lists them)."""
    return update_wrapper(partial(builder, **values), builder)


def screen_builders(entries: Mapping[str, Mapping[str, Any]] | None = None,
                    identities: Mapping[str, str] | None = None, state: StateStore | None = None) -> list[Builder]:
    """The builders of the guardrails that screen definitions, outermost first; each returns None when its
    guardrail is off everywhere. ``entries``: the servers' configuration entries, which pinning pins too;
    ``identities``: the identity each server is pinned under; ``state``: where what outlives a request is kept
    (the pins too, when replicas share it)."""
    from bastion.guardrails.injection import build_metadata
    from bastion.guardrails.pinning import build as build_pinning
    from bastion.guardrails.taint import build_recall as build_taint_recall

    # The metadata scan refuses calls to the tools it withholds itself (one layer, not two).
    return [given(build_pinning, entries=entries, identities=identities, state=state), build_metadata,
            given(build_taint_recall, state=state)]


def inner_builders(state: StateStore | None = None) -> list[Builder]:
    """The builders of the guardrails inside the policy, outermost first; ``state``: where what outlives a request
    is kept."""
    from bastion.guardrails.consent import build as build_consent
    from bastion.guardrails.deputy import build as build_deputy
    from bastion.guardrails.flow import build as build_flow
    from bastion.guardrails.injection import build_output
    from bastion.guardrails.sampling import build as build_sampling
    from bastion.guardrails.scanning import build as build_scanning
    from bastion.guardrails.taint import build as build_taint

    # Flow is outermost: the answers it remembers values of are the ones the client gets, already redacted.
    # Consent's budget refuses before the output scan marks: a request over it is never scanned nor shown.
    return [given(build_flow, state=state), build_deputy, build_taint, given(build_sampling, state=state),
            given(build_consent, state=state), build_output, build_scanning]


@dataclass(frozen=True, slots=True)
class GuardrailChain:
    screens: list[Interceptor]  # before the policy
    inner: list[Interceptor]  # inside the policy

    def all(self) -> list[Interceptor]:
        return [*self.screens, *self.inner]


def build_guardrails(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView,
                     entries: Mapping[str, Mapping[str, Any]] | None = None,
                     identities: Mapping[str, str] | None = None,
                     out_of_band: "OutOfBand | None" = None,
                     client_approves: "ClientApproves | None" = None,
                     state: StateStore | None = None) -> GuardrailChain:
    """``out_of_band``: where the guardrails that hold a call ask a person the client cannot reach (the policy's
    approval queue); without it such a call is refused. ``client_approves``: whether a session's client may be
    asked at all (the policy's ``approval.approver``; without a policy, only a client on stdio). ``state``: the
    gateway's store, where a caller's taint, the values its answers carried and the budgets of servers' requests
    are kept, so that replicas sharing it judge alike (without one, a store of this chain's own)."""
    state = state or MemoryStore()
    def built(builders: list[Builder]) -> list[Interceptor]:
        made = (builder(config, report, catalog) for builder in builders)
        return [interceptor for interceptor in made if interceptor is not None]

    inner = built(inner_builders(state))
    for interceptor in inner:
        if hasattr(interceptor, "out_of_band"):
            interceptor.out_of_band = out_of_band  # type: ignore[attr-defined]
            interceptor.client_approves = client_approves  # type: ignore[attr-defined]
    chain = GuardrailChain(screened(built(screen_builders(entries, identities, state))), staged(inner))
    # The guardrails that read a call's result as the server's bytes share one decoder, so that a result is decoded
    # once however many of them read it (bastion.guardrails.raw).
    shared = RawResults()
    for interceptor in chain.all():
        if isinstance(getattr(interceptor, "raw_results", None), RawResults):
            interceptor.raw_results = shared  # type: ignore[attr-defined]
    return chain


def screened(screens: list[Interceptor]) -> list[Interceptor]:
    """``screens`` with the guardrails that screen a ``tools/call`` before the policy (pinning, the metadata scan's
    refusal of withheld tools, taint recall) joined, for that method, into one ``ScreenStage`` where the outermost of
    them was; each keeps its own layer for every other method."""
    from bastion.guardrails.injection import MetadataGuard
    from bastion.guardrails.pinning import PinningGuard
    from bastion.guardrails.stage import ScreenStage
    from bastion.guardrails.taint import TaintRecall

    return _joined(screens, {PinningGuard: "pinning", MetadataGuard: "metadata", TaintRecall: "recall"}, ScreenStage)


def staged(inner: list[Interceptor]) -> list[Interceptor]:
    """``inner`` with the guardrails that read a ``tools/call``'s answer (deputy, taint, output injection, scanning)
    joined, for that method, into one ``CallStage`` where the outermost of them was; each keeps its own layer for
    every other method."""
    from bastion.guardrails.deputy import DeputyGuard
    from bastion.guardrails.injection import OutputGuard
    from bastion.guardrails.scanning import ScanningInterceptor
    from bastion.guardrails.stage import CallStage
    from bastion.guardrails.taint import TaintGuard

    roles = {DeputyGuard: "deputy", TaintGuard: "taint", OutputGuard: "output", ScanningInterceptor: "scanning"}
    return _joined(inner, roles, CallStage)


def _joined(interceptors: list[Interceptor], roles: dict[type, str], stage: Callable[..., Interceptor],
            ) -> list[Interceptor]:
    """``interceptors`` with those of ``roles`` that look at ``tools/call`` joined, for that method, into one
    ``stage`` (built with each by its role) where the outermost of them was, and ``tools/call`` taken off their own
    routes. For a call they are consecutive in the chain (no other interceptor sits between them), so the stage sees
    a call where the first of them did and hands it on where the last of them did."""
    from bastion.guardrails.stage import CALL

    parts: dict[str, Any] = {}
    first: int | None = None
    for index, interceptor in enumerate(interceptors):
        role = roles.get(type(interceptor))
        if role is None or not _on_calls(interceptor):
            continue
        if first is None:
            first = index
        parts[role] = interceptor
    if first is None:
        return interceptors
    others = interceptors[first:]
    if any(type(each) not in roles and _on_calls(each)
           for each in others[:max(i for i, each in enumerate(others) if type(each) in roles) + 1]):
        return interceptors  # something else reads calls between them: they stay layers of their own
    for interceptor in parts.values():
        methods = getattr(interceptor, "methods", None)
        without = EveryMethodBut(frozenset({CALL})) if methods is None else methods - {CALL}
        interceptor.methods = without  # type: ignore[attr-defined]
    return [*interceptors[:first], stage(**parts), *interceptors[first:]]


def _on_calls(interceptor: Interceptor) -> bool:
    """Whether ``tools/call`` is among the methods ``interceptor`` looks at (every method, when it names none)."""
    from bastion.guardrails.stage import CALL

    methods = getattr(interceptor, "methods", None)
    return methods is None or CALL in methods


class EveryMethodBut:
    """The ``methods`` of an interceptor that looks at every method but a few (the chain asks ``method in
    methods``): what one that named no methods looks at once a stage takes a method off its route."""

    __slots__ = ("excluded",)

    def __init__(self, excluded: frozenset[str]) -> None:
        self.excluded = excluded

    def __contains__(self, method: object) -> bool:
        return method not in self.excluded

    def __sub__(self, other: Iterable[str]) -> "EveryMethodBut":
        return EveryMethodBut(self.excluded | frozenset(other))

    def __repr__(self) -> str:
        return f"EveryMethodBut({set(self.excluded)!r})"
