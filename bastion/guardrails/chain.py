"""The guardrail interceptors a configuration asks for, in the order the chain needs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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

    chain = GuardrailChain(built(screen_builders()), built(inner_builders()))
    # The guardrails that read a call's result as the server's bytes share one decoder, so that a result is decoded
    # once however many of them read it (bastion.guardrails.raw).
    shared = RawResults()
    for interceptor in chain.all():
        if isinstance(getattr(interceptor, "raw_results", None), RawResults):
            interceptor.raw_results = shared  # type: ignore[attr-defined]
    return chain
