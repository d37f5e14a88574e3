"""The guardrail interceptors a configuration asks for, in the order the chain needs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.raw import RawResults
from bastion.guardrails.report import InterventionLog
from bastion.model import CatalogView, Interceptor

# The first guardrail sees a client's request first and the result last. Pinning and metadata scanning decide what
# is served at all, so they screen requests before the policy does: a person is never asked to approve a call to a
# tool that would be refused as changed or poisoned. The taint a 2026-07-28 caller's earlier requests left is recalled
# there too, so that the policy sees it as a session's own. The others sit inside the policy and see only what it
# permits; the scanners of results sit innermost, so a result is redacted before it is marked and before taint is
# recorded from it.
Builder = Callable[[GuardrailsConfig, InterventionLog, CatalogView], "Interceptor | None"]


def screen_builders() -> list[Builder]:
    """The builders of the guardrails that screen definitions, outermost first; each returns None when its
    guardrail is off everywhere."""
    from bastion.guardrails.injection import build_metadata
    from bastion.guardrails.pinning import build as build_pinning
    from bastion.guardrails.taint import build_recall as build_taint_recall

    # The metadata scan refuses calls to the tools it withholds itself (one layer, not two).
    return [build_pinning, build_metadata, build_taint_recall]


def inner_builders() -> list[Builder]:
    """The builders of the guardrails inside the policy, outermost first."""
    from bastion.guardrails.deputy import build as build_deputy
    from bastion.guardrails.injection import build_output
    from bastion.guardrails.sampling import build as build_sampling
    from bastion.guardrails.scanning import build as build_scanning
    from bastion.guardrails.taint import build as build_taint

    return [build_deputy, build_taint, build_sampling, build_output, build_scanning]


@dataclass(frozen=True, slots=True)
class GuardrailChain:
    screens: list[Interceptor]  # before the policy
    inner: list[Interceptor]  # inside the policy

    def all(self) -> list[Interceptor]:
        return [*self.screens, *self.inner]


def build_guardrails(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView) -> GuardrailChain:
    def built(builders: list[Builder]) -> list[Interceptor]:
        made = (builder(config, report, catalog) for builder in builders)
        return [interceptor for interceptor in made if interceptor is not None]

    chain = GuardrailChain(built(screen_builders()), staged(built(inner_builders())))
    # The guardrails that read a call's result as the server's bytes share one decoder, so that a result is decoded
    # once however many of them read it (bastion.guardrails.raw).
    shared = RawResults()
    for interceptor in chain.all():
        if isinstance(getattr(interceptor, "raw_results", None), RawResults):
            interceptor.raw_results = shared  # type: ignore[attr-defined]
    return chain


def staged(inner: list[Interceptor]) -> list[Interceptor]:
    """``inner`` with the guardrails that read a ``tools/call``'s answer (deputy, taint, output injection, scanning)
    joined, for that method, into one ``CallStage`` where the outermost of them was; each keeps its own layer for
    every other method. For a call they are consecutive in the chain (no other interceptor sits between them), so
    the stage sees a call where the first of them did and hands it on where the last of them did."""
    from bastion.guardrails.deputy import DeputyGuard
    from bastion.guardrails.injection import OutputGuard
    from bastion.guardrails.scanning import ScanningInterceptor
    from bastion.guardrails.stage import CALL, CallStage
    from bastion.guardrails.taint import TaintGuard

    roles = {DeputyGuard: "deputy", TaintGuard: "taint", OutputGuard: "output", ScanningInterceptor: "scanning"}
    parts: dict[str, Any] = {}
    first: int | None = None
    for index, interceptor in enumerate(inner):
        role = roles.get(type(interceptor))
        if role is None or CALL not in interceptor.methods:  # type: ignore[attr-defined]
            continue
        if first is None:
            first = index
        parts[role] = interceptor
    if first is None:
        return inner
    others = inner[first:]
    if any(type(each) not in roles and CALL in (getattr(each, "methods", None) or {CALL})
           for each in others[:max(i for i, each in enumerate(others) if type(each) in roles) + 1]):
        return inner  # something else reads calls between them: they stay layers of their own
    for interceptor in parts.values():
        interceptor.methods = interceptor.methods - {CALL}  # type: ignore[attr-defined]
    return [*inner[:first], CallStage(**parts), *inner[first:]]
