"""The composition root: the one place a configuration becomes a running gateway and its parts.

The policy runtime, the search exposure and the tool index are built here and handed to the Gateway, which only
routes; so the policy and search packages never need the gateway, and every frontend (``bastion run``,
``bastion serve``, the one-shot commands, the host API) gets the same interceptor chain from the same call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

from bastion.config import GatewayConfig, ToolsConfig
from bastion.gateway.core import Gateway, server_catalog
from bastion.gateway.launch import launch_server
from bastion.gateway.upstream import Launcher
from bastion.guardrails.chain import GuardrailChain, build_guardrails
from bastion.guardrails.report import InterventionLog
from bastion.server_entry import pin_identities, pinned_entries
from bastion.model import CatalogView, Interceptor
from bastion.policy.interceptors import PolicyRuntime, build_policy_runtime

if TYPE_CHECKING:
    from bastion.search.exposure import CatalogIndex
    from bastion.search.index import ToolIndex

log = logging.getLogger("bastion.gateway")


def build_gateway(
    config: GatewayConfig,
    *,
    interceptors: Sequence[Interceptor] = (),
    launcher: Launcher = launch_server,
) -> Gateway:
    """The gateway ``config`` describes: its servers, search exposure in search mode, the guardrails that screen
    definitions, the policy (unless it is off), the other guardrails (unless they are off), then ``interceptors``
    (innermost: they see only what all of those let through). Raises ``PolicyStartError`` when the policy cannot start (a key that cannot
    be read, an audit trail that cannot be written)."""
    catalog = server_catalog(config)
    policy = build_policy(config)
    guardrails = build_guardrail_chain(config, policy, catalog)
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
    gateway = Gateway(config, catalog=catalog, policy=policy, exposure=exposure, screens=guardrails.screens,
                      interceptors=[*guardrails.inner, *interceptors], tool_index=tool_index, launcher=launcher)
    servers.gateway = gateway
    from bastion.reload import Reloader  # here: it builds its policy and guardrails with this module's functions

    gateway.reloader = Reloader(gateway, lambda new, running: reloaded_parts(new, running, catalog))
    return gateway


def reloaded_parts(config: GatewayConfig, running: PolicyRuntime | None,
                   catalog: CatalogView) -> tuple[PolicyRuntime | None, GuardrailChain]:
    """The policy and guardrails a reloaded ``config`` describes, the running policy handing over what it keeps.
    Whether there is a policy at all changes only with a restart (``bastion.reload.restart_keys``): said at
    start, not again; guardrails turned off are said by the reload."""
    policy = None if config.policy is None else build_policy(config, previous=running)
    if config.guardrails is None:
        return policy, GuardrailChain([], [])
    return policy, build_guardrail_chain(config, policy, catalog)


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


def build_policy(config: GatewayConfig, previous: PolicyRuntime | None = None) -> PolicyRuntime | None:
    """The policy runtime of ``config``, None when its policy is off (said once, as a warning). ``previous``, the
    runtime a reload replaces, hands over its audit writer (one process holds a trail's hash chain) and its shared
    state (an approval used before the reload stays used)."""
    if config.policy is None:
        if previous is None:
            log.warning("policy is off: every call is allowed and nothing is audited")
        return None
    pre_approved = {name: cfg.auto_approve for name, cfg in config.servers.items() if cfg.enabled}
    claims = tuple(config.auth.claims.attributes) if config.auth is not None else ()
    if previous is None:
        return build_policy_runtime(config.policy, pre_approved=pre_approved, claim_attributes=claims)
    return build_policy_runtime(config.policy, pre_approved=pre_approved, claim_attributes=claims,
                                audit_writer=previous.audit.writer, shared_state=previous.state)


def build_guardrail_chain(config: GatewayConfig, policy: PolicyRuntime | None, catalog: CatalogView) -> GuardrailChain:
    """The guardrail interceptors of ``config`` (none when they are off, said once, as a warning); their
    interventions go to the policy's audit trail when there is one."""
    if config.guardrails is None:
        log.warning("guardrails are off: tool definitions are not pinned and results are not scanned")
        return GuardrailChain([], [])
    writer = policy.audit.writer if policy is not None else None
    report = InterventionLog(writer.write if writer is not None else None)
    out_of_band = policy.approval.ask_out_of_band if policy is not None else None
    client_approves = policy.approval.client_approves if policy is not None else None
    return build_guardrails(config.guardrails, report, catalog, pinned_entries(config), pin_identities(config),
                            out_of_band, client_approves)


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
