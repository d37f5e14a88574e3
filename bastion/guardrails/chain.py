"""The guardrail interceptors a configuration asks for, in the order the chain needs them."""

from __future__ import annotations

from typing import Callable

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.report import InterventionLog
from bastion.model import CatalogView, Interceptor

# The first guardrail sees a client's request first and the result last: pinning and metadata scanning hide what must
# not be listed before anything else looks at it, and the scanners of results sit innermost, so a result is
# redacted before it is marked and before taint is recorded from it.
Builder = Callable[[GuardrailsConfig, InterventionLog, CatalogView], "Interceptor | None"]


def builders() -> list[Builder]:
    """Each guardrail's builder, outermost first; a builder returns None when its guardrail is off everywhere."""
    from bastion.guardrails.pinning import build as pinning_guardrail

    ordered: list[Builder] = []
    ordered.append(pinning_guardrail)  # slot 1: pinning
    from bastion.guardrails.injection import build_metadata as metadata_injection_guardrail
    from bastion.guardrails.injection import build_metadata_gate as withheld_tool_gate
    ordered.append(metadata_injection_guardrail)  # slot 2: metadata injection
    ordered.append(withheld_tool_gate)
    from bastion.guardrails.deputy import build as deputy_guardrail
    ordered.append(deputy_guardrail)
    from bastion.guardrails.taint import build as taint_guardrail
    ordered.append(taint_guardrail)
    from bastion.guardrails.sampling import build as sampling_guardrail
    ordered.append(sampling_guardrail)
    from bastion.guardrails.injection import build_output as output_injection_guardrail
    ordered.append(output_injection_guardrail)  # slot 6: output injection
    from bastion.guardrails.scanning import build as scanning_guardrail
    ordered.append(scanning_guardrail)
    return ordered


def build_guardrails(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView) -> list[Interceptor]:
    built = (builder(config, report, catalog) for builder in builders())
    return [interceptor for interceptor in built if interceptor is not None]
