"""The composition root: the one place a configuration becomes a running gateway and its parts.

The policy runtime, the search exposure and the tool index are built here and handed to the Gateway, which only
routes; so the policy and search packages never need the gateway, and every frontend (``bastion run``,
``bastion serve``, the one-shot commands, the host API) gets the same interceptor chain from the same call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from bastion.config import GatewayConfig, ToolsConfig
from bastion.gateway.core import Gateway, server_catalog
from bastion.gateway.launch import launch_server
from bastion.gateway.upstream import Launcher
from bastion.guardrails.chain import GuardrailChain, build_guardrails
from bastion.guardrails.report import InterventionLog
from bastion.server_entry import pin_identities, pinned_entries
from bastion.model import CatalogView, Interceptor
from bastion.observability.metrics import GatewayMetrics
from bastion.policy.interceptors import PolicyRuntime, build_policy_runtime
from bastion.policy.config import PolicyStartError
from bastion.state import MemoryStore, StateStore

if TYPE_CHECKING:
    from bastion.search.exposure import CatalogIndex
    from bastion.search.index import ToolIndex

log = logging.getLogger("bastion.gateway")


def build_gateway(
    config: GatewayConfig,
    *,
    interceptors: Sequence[Interceptor] = (),
    launcher: Launcher = launch_server,
    log_context: bool = False,
    state: StateStore | None = None,
) -> Gateway:
    """The gateway ``config`` describes: its servers, the metrics' meter (unless they are off), search exposure in
    search mode, the guardrails that screen definitions, the policy (unless it is off), the other guardrails (unless
    they are off), then ``interceptors`` (they see only what all of those let through), then the metrics' clock;
    tracing when ``config.tracing`` asks for it, and with ``log_context`` (JSON logs) each request's facts for the log
    lines written during it. ``state``: a store to share (gateways in one process on one store act as replicas on
    one Redis); by default the one ``config`` names. Raises ``PolicyStartError`` when the policy cannot start (a key
    that cannot be read, an audit trail that cannot be written, replicas without the tokens' key)."""
    catalog = server_catalog(config)
    state = state if state is not None else build_state(config)
    check_token_key(config, state)
    policy = build_policy(config, state=state)
    interventions = intervention_log(config, policy)
    guardrails = build_guardrail_chain(config, policy, catalog, interventions, state=state)
    metrics = GatewayMetrics(config.metrics) if config.metrics.enabled else None
    tool_index: CatalogIndex | LazyCatalogIndex
    exposure: list[Interceptor] = []
    from bastion.search.stack import announce

    # The exposure asks the gateway, made after it, which servers are still starting.
    servers = ServersStarting()
    announce()  # what search runs on, a warning when it is less than the hybrid: before the first search needs it
    if config.tools.exposure == "search":
        # Imported only here: the index brings numpy and a model runtime that "all" mode never needs.
        from bastion.search.exposure import SearchExposure

        tool_index = catalog_index(catalog, config.tools)
        exposure.append(SearchExposure(tool_index, config.tools.always_list, servers.starting, servers.joined))
    else:
        tool_index = LazyCatalogIndex(catalog, config.tools)
        if config.tools.exposure == "auto":
            exposure.append(auto_exposure(catalog, config.tools, tool_index, servers))
    observer = build_observer(config, log_context)
    watch_policy(policy, metrics, observer)
    # The metrics' meter is outermost, to see what every later step refuses; its clock innermost, to tell the
    # server's time from the gateway's.
    gateway = Gateway(config, catalog=catalog, policy=policy, outermost=[metrics.meter] if metrics else [],
                      exposure=exposure, screens=guardrails.screens,
                      interceptors=[*guardrails.inner, *interceptors, *([metrics.clock] if metrics else [])],
                      tool_index=tool_index, launcher=launcher, observer=observer, state=state)
    servers.gateway = gateway
    if metrics is not None:
        attach_metrics(gateway, metrics, interventions)
    from bastion.reload import Reloader  # here: it builds its policy and guardrails with this module's functions

    kept = interventions
    gateway.reloader = Reloader(gateway, lambda new, running: reloaded_parts(new, running, catalog, gateway, kept))
    return gateway


def reloaded_parts(config: GatewayConfig, running: PolicyRuntime | None, catalog: CatalogView, gateway: Gateway,
                   interventions: InterventionLog | None) -> tuple[PolicyRuntime | None, GuardrailChain]:
    """The policy and guardrails a reloaded ``config`` describes, the running policy handing over what it keeps
    (its audit writer: so the guardrails' intervention log, which writes there, is kept too), each watched by the
    gateway's metrics and tracing as the first were. Whether there is a policy at all changes only with a restart
    (``bastion.reload.restart_keys``): said at start, not again; guardrails turned off are said by the reload."""
    policy = None if config.policy is None else build_policy(config, previous=running, state=gateway.state)
    watch_policy(policy, gateway.metrics, gateway.observer)
    if config.guardrails is None:
        return policy, GuardrailChain([], [])
    if interventions is None:
        interventions = intervention_log(config, policy)
        if gateway.metrics is not None:
            gateway.metrics.interventions = interventions
    return policy, build_guardrail_chain(config, policy, catalog, interventions, state=gateway.state)


def watch_policy(policy: PolicyRuntime | None, metrics: GatewayMetrics | None, observer: Any) -> None:
    """The policy's decisions counted by the metrics, and its waits for a person traced, when either is on."""
    if policy is None:
        return
    if metrics is not None:
        policy.tell_decisions(metrics.decided)
    if observer is not None and policy.approval is not None:
        policy.approval.watch = observer.span


def build_observer(config: GatewayConfig, log_context: bool) -> Any:
    """What watches each client request: tracing (``[tracing]``; OpenTelemetry is imported only then), or with JSON
    logs alone the request's facts for its log lines; None when neither is asked for, so the chain is compiled as
    if observability did not exist."""
    if config.tracing is not None:
        from bastion.observability.tracing_config import sdk_disabled

        if not sdk_disabled():
            from bastion.observability.tracing import build_tracing

            return build_tracing(config.tracing, log_context=log_context)
        log.info("tracing: OTEL_SDK_DISABLED is true, so no spans are recorded")
    if log_context:
        from bastion.observability.request_context import RequestLogContext

        return RequestLogContext()
    return None


def attach_metrics(gateway: Gateway, metrics: GatewayMetrics, interventions: InterventionLog | None) -> None:
    """Give the gateway its metrics, and tell the metrics what they read from the gateway. Their registry is made
    on the first scrape (prometheus-client takes 60 ms to import: no start of a gateway nobody scrapes pays it)."""
    metrics.server_for = gateway.server_for
    metrics.interventions = interventions
    gateway.metrics = metrics


class ServersStarting:
    """The gateway's servers that have not joined yet, for the search exposure, which is built before the gateway."""

    def __init__(self) -> None:
        self.gateway: Gateway | None = None

    def starting(self) -> list[tuple[str, str]]:
        return self.gateway.starting_servers() if self.gateway is not None else []

    async def joined(self) -> None:
        """Until the servers still starting have joined, within the gateway's ``ready_timeout``."""
        if self.gateway is not None:
            await self.gateway.wait_ready(report=False)


def build_state(config: GatewayConfig) -> StateStore:
    """What the gateway shares with its replicas (bastion/state/): the Redis ``[state]`` names, else this process's
    memory. Nothing is connected here: the gateway's start asks the store (``Gateway.start``)."""
    settings = config.state
    if settings is None:
        return MemoryStore()
    # Imported only here: a gateway without [state] never loads the Redis client.
    from bastion.state.redis_store import RedisStore

    return RedisStore(settings.url, password=settings.password, username=settings.username,
                      key_prefix=settings.key_prefix, timeout=settings.timeout_seconds,
                      max_connections=settings.max_connections, tls_ca_file=settings.tls_ca_file,
                      tls_cert_file=settings.tls_cert_file, tls_key_file=settings.tls_key_file)


def check_token_key(config: GatewayConfig, state: StateStore) -> None:
    """Refuse to start replicas sharing ``state`` whose servers need stored tokens without the key every replica
    must be given (``BASTION_CREDENTIALS_KEY``): each would make a key file of its own and read the others' tokens
    as damage."""
    if not state.shared:
        return
    from bastion.credentials.state_store import needs_tokens, required_key
    from bastion.transport.credentials import CredentialsError

    servers = needs_tokens(config.servers)
    if not servers:
        return
    try:
        required_key()
    except CredentialsError as exc:
        raise PolicyStartError(f"servers {', '.join(servers)} keep upstream tokens: {exc}") from None


def build_policy(config: GatewayConfig, previous: PolicyRuntime | None = None,
                 state: StateStore | None = None) -> PolicyRuntime | None:
    """The policy runtime of ``config``, None when its policy is off (said once, as a warning), keeping what it must
    share with replicas in ``state`` (the gateway's: a reload hands the same store over, so an approval used before
    the reload stays used, and a rate limit the reload keeps keeps its buckets). ``previous``, the runtime a reload
    replaces, hands over its audit writer (one process holds a trail's hash chain)."""
    if config.policy is None:
        if previous is None:
            log.warning("policy is off: every call is allowed and nothing is audited")
        return None
    pre_approved = {name: cfg.auto_approve for name, cfg in config.servers.items() if cfg.enabled}
    claims = tuple(config.auth.claims.attributes) if config.auth is not None else ()
    if previous is None:
        return build_policy_runtime(config.policy, pre_approved=pre_approved, claim_attributes=claims,
                                    shared_state=state, config_file=_source(config))
    return build_policy_runtime(config.policy, pre_approved=pre_approved, claim_attributes=claims,
                                audit_writer=previous.audit.writer,
                                shared_state=state if state is not None else previous.state,
                                config_file=_source(config))


def _source(config: GatewayConfig) -> str | None:
    return str(config.source) if config.source is not None else None


def intervention_log(config: GatewayConfig, policy: PolicyRuntime | None) -> InterventionLog | None:
    """Where the guardrails report their interventions (None when they are off): the log, the counts the metrics
    read, and the policy's audit trail when there is one."""
    if config.guardrails is None:
        return None
    writer = policy.audit.writer if policy is not None else None
    return InterventionLog(writer.write if writer is not None else None)


def build_guardrail_chain(config: GatewayConfig, policy: PolicyRuntime | None, catalog: CatalogView,
                          report: InterventionLog | None = None, state: StateStore | None = None) -> GuardrailChain:
    """The guardrail interceptors of ``config`` (none when they are off, said once, as a warning), reporting to
    ``report`` (by default a log of their own)."""
    if config.guardrails is None:
        log.warning("guardrails are off: tool definitions are not pinned and results are not scanned")
        return GuardrailChain([], [])
    if report is None:
        report = intervention_log(config, policy)
        assert report is not None
    out_of_band = policy.approval.ask_out_of_band if policy is not None else None
    client_approves = policy.approval.client_approves if policy is not None else None
    return build_guardrails(config.guardrails, report, catalog, pinned_entries(config), pin_identities(config),
                            out_of_band, client_approves, state)


def catalog_index(catalog: CatalogView, tools: ToolsConfig) -> CatalogIndex:
    """The search index that follows ``catalog``; embeddings are cached on disk, so a restart or a list_changed
    embeds only tool texts never seen."""
    from bastion.search.embedding import default_cache_dir
    from bastion.search.exposure import CatalogIndex
    from bastion.search.index import ToolIndex

    cache = default_cache_dir()
    tokens = tools.embedding_tokens
    return CatalogIndex(catalog, lambda: ToolIndex(cache_dir=cache, doc_max_tokens=tokens))


def auto_exposure(catalog: CatalogView, tools: ToolsConfig, index: "LazyCatalogIndex",
                  servers: ServersStarting | None = None) -> Interceptor:
    """Exposure "auto": search mode past the size bound or while servers are still starting, built (with the
    index's libraries) only once it is."""
    from bastion.search.auto import AutoExposure

    servers = servers or ServersStarting()

    def search_exposure() -> Interceptor:
        from bastion.search.exposure import SearchExposure

        return SearchExposure(index, tools.always_list, servers.starting, servers.joined)

    return AutoExposure(catalog, search_exposure, starting=servers.starting)


class LazyCatalogIndex:
    """``catalog_index`` built on the first search: in "all" mode only the host API's ``find_tools`` searches, and
    a gateway that never does should not load the index's libraries."""

    def __init__(self, catalog: CatalogView, tools: ToolsConfig) -> None:
        self._catalog = catalog
        self._tools = tools
        self._index: CatalogIndex | None = None

    async def current(self) -> ToolIndex:
        if self._index is None:
            self._index = catalog_index(self._catalog, self._tools)
        return await self._index.current()

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
