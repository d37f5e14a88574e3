"""OpenTelemetry traces of the gateway's requests, exported over OTLP/HTTP: imported only when tracing is on.

The chain compiles its routes with this observer (``Chain(..., observer=...)``): a client request's route gets a
span of its own around its whole way (the W3C trace context the client sent, in its ``_meta`` or in the HTTP
headers, is its parent), each interceptor on it a span (``policy``, ``guardrails`` ...: each holds what follows it,
so its own time is its duration less its child's), the approval wait a span where the policy waits for a person,
and the call to a server a span whose context the server is sent in the request's ``_meta`` (and, to a remote
server, as the ``traceparent``/``tracestate``/``baggage`` headers). A gateway built without it compiles its routes
exactly as before: no span, no call, no import of OpenTelemetry.

Span attributes name what was asked, never what it carried: the method, the catalog's tool and server, the
outcome, how the caller was identified (its class, not its name) and the client's era. No argument, result, error
text or client string is put on a span.
"""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bastion import __version__
from bastion.model import GatewayError, GatewayRequest
from bastion.observability.request_context import (
    INCOMING_TRACE, REQUEST, TRACE_KEYS, call_entry, facts_of, meta_carrier, trace_carrier,
)
from bastion.observability.tracing_config import TracingConfig

log = logging.getLogger("bastion.tracing")

Handler = Callable[[GatewayRequest], Awaitable[Any]]
Hook = Callable[[GatewayRequest, Handler], Awaitable[Any]]
# The W3C trace context and baggage, read from a client and written to a server; never the process-wide propagator.
PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


def build_provider(config: TracingConfig, exporter: SpanExporter | None = None) -> TracerProvider:
    """A tracer provider of the gateway's own (never the global one), batching spans to the OTLP/HTTP exporter:
    ``config``'s endpoint, else the OTEL_EXPORTER_OTLP_* variables (headers, timeout, certificates, compression are
    the exporter's to read)."""
    attributes: dict[str, Any] = {"service.version": __version__}
    if config.service_name is not None:
        attributes[SERVICE_NAME] = config.service_name
    elif not os.environ.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = "bastion"
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; what is given here wins over them.
    provider = TracerProvider(resource=Resource.create(attributes),
                              sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=config.traces_url())))
    return provider


def step_name(interceptor: Any) -> str:
    """An interceptor's span: its ``span_name`` (``policy``, ``guardrails`` ...), else its package and class, as
    ``guardrails.ScanningInterceptor`` (a caller's own interceptor: its class alone)."""
    named = getattr(interceptor, "span_name", None)
    if named:
        return str(named)
    kind = type(interceptor)
    parts = kind.__module__.split(".")
    return f"{parts[1]}.{kind.__name__}" if parts[0] == "bastion" and len(parts) > 2 else kind.__name__


def outcome_of(result: Any) -> str:
    if isinstance(result, dict):
        if result.get("isError") is True:
            return "tool_error"
        return str(result.get("resultType", "complete"))[:32]
    return "complete"


def refused(span: trace.Span, error: GatewayError) -> None:
    # The code, never the message: a refusal's text may quote the client's own arguments.
    span.set_attribute("bastion.outcome", "refused")
    span.set_attribute("rpc.jsonrpc.error_code", error.code)
    span.set_status(Status(StatusCode.ERROR, f"refused with JSON-RPC error {error.code}"))


class Tracing:
    """The chain's observer while tracing is on: spans for each client request, its steps, an approval wait and
    its server call; with ``log_context``, the request's facts for JSON log lines too."""

    # A request's ``_meta`` (the client's trace context) and a call's name only: a call that has a ``_meta`` is
    # decoded anyway, and a name is read from the client's bytes, so params nothing else reads stay those bytes.
    reads_params = False
    reads_results = False  # it only tells a result from a refusal: a call's result may stay the server's bytes

    def __init__(self, provider: TracerProvider, *, log_context: bool = False) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("bastion", __version__)
        self._log_context = log_context

    def request(self, handle: Handler, method: str) -> Handler:
        """``handle`` (a client request's route) inside a span continuing the client's trace."""
        tracer = self.tracer
        log_context = self._log_context

        async def traced(message: GatewayRequest) -> Any:
            carrier = meta_carrier(message.params) or trace_carrier(INCOMING_TRACE.get())
            parent = PROPAGATOR.extract(carrier) if carrier else otel_context.Context()
            entry = call_entry(message)
            attributes: dict[str, Any] = {
                "mcp.method.name": method,
                "bastion.identity_class": message.session.identity.authenticated_by,
                "bastion.era": message.session.era,
            }
            if entry is not None:
                attributes["gen_ai.tool.name"] = entry.exposed_name
                attributes["bastion.server"] = entry.server
            name = f"{method} {entry.exposed_name}" if entry is not None else method
            token = otel_context.attach(parent)  # its baggage goes on to the servers with the span's context
            try:
                with tracer.start_as_current_span(name, kind=SpanKind.SERVER, attributes=attributes,
                                                  record_exception=False, set_status_on_exception=False) as span:
                    facts = REQUEST.set(facts_of(message, format(span.get_span_context().trace_id, "032x"))) \
                        if log_context else None
                    try:
                        result = await handle(message)
                    except GatewayError as error:
                        refused(span, error)
                        raise
                    except asyncio.CancelledError:
                        span.set_attribute("bastion.outcome", "cancelled")
                        raise
                    except Exception as error:
                        span.set_attribute("bastion.outcome", "error")
                        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
                        raise
                    finally:
                        if facts is not None:
                            REQUEST.reset(facts)
                    span.set_attribute("bastion.outcome", outcome_of(result))
                    return result
            finally:
                otel_context.detach(token)

        return traced

    def step(self, interceptor: Any, hook: Hook) -> Hook:
        """An interceptor's hook inside a span of its own, the refusal it raises as its status; an interceptor whose
        ``span_name`` is None (the metrics' meter and clock: measuring, not deciding) gets none."""
        if hasattr(interceptor, "span_name") and interceptor.span_name is None:
            return hook
        tracer = self.tracer
        name = step_name(interceptor)

        async def traced(message: GatewayRequest, call_next: Handler) -> Any:
            with tracer.start_as_current_span(name, record_exception=False, set_status_on_exception=False) as span:
                try:
                    return await hook(message, call_next)
                except GatewayError as error:
                    refused(span, error)
                    raise

        return traced

    def upstream(self, forward: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """The router's call to a server inside a client span whose context the server is sent in ``_meta``."""
        tracer = self.tracer

        async def traced(request: GatewayRequest, server: str, params: dict[str, Any], *args: Any) -> Any:
            with tracer.start_as_current_span("upstream call", kind=SpanKind.CLIENT,
                                              attributes={"bastion.server": server, "mcp.method.name": request.method},
                                              record_exception=False, set_status_on_exception=False) as span:
                carrier: dict[str, str] = {}
                PROPAGATOR.inject(carrier)
                meta = params.get("_meta")
                meta = {k: v for k, v in meta.items() if k not in TRACE_KEYS} if isinstance(meta, dict) else {}
                try:
                    result = await forward(request, server, {**params, "_meta": {**meta, **carrier}}, *args)
                except GatewayError as error:
                    refused(span, error)
                    raise
                span.set_attribute("bastion.outcome", outcome_of(result) if isinstance(result, dict) else "complete")
                return result

        return traced

    @contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[None]:
        """A span of its own inside the current one (the approval wait)."""
        with self.tracer.start_as_current_span(name, attributes=attributes, record_exception=False):
            yield

    async def aclose(self) -> None:
        """Send the spans still batched, then stop: at the gateway's close (a thread, as the exporter blocks)."""
        await asyncio.to_thread(self.provider.shutdown)


def build_tracing(config: TracingConfig, *, log_context: bool = False) -> Tracing:
    """The gateway's tracing for ``config`` (the caller has checked OTEL_SDK_DISABLED: ``sdk_disabled``)."""
    return Tracing(build_provider(config), log_context=log_context)
