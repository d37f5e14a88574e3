"""The gateway: many upstream servers federated into one, every message of every client and server through one
chain. ``Gateway`` composes the parts that each do one job and runs their lifetime (start, wait until ready,
close); the parts are the router (a client's request to its server: router.py), the relay (the servers'
requests and notifications toward clients: relay.py), subscriptions (subscriptions.py), the catalog's refresh
and list_changed (refresh.py) and the ``input_required`` rounds (input_rounds.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Sequence

from bastion import __version__
from bastion.config import GatewayConfig, ServerConfig
from bastion.credentials.build import CredentialSource
from bastion.credentials.oauth_client import AuthorizationCodes
from bastion.credentials.state_store import token_store_opener
from bastion.gateway.bridge import InputBridge
from bastion.clients.known_tools import server_nature
from bastion.gateway.catalog import Catalog, ServerFacts
from bastion.gateway.input_rounds import InputRounds
from bastion.gateway.launch import launch_server
from bastion.gateway.log_levels import LogLevels
from bastion.gateway.pipeline import Chain
from bastion.gateway.pool import InstanceListener, UpstreamPool
from bastion.gateway.refresh import CatalogRefresh
from bastion.gateway.relay import RELAYABLE_CLIENT_CAPABILITIES, ConnectedClient, Relay, relayable
from bastion.gateway.router import Router
from bastion.gateway.subscriptions import Subscriptions
from bastion.gateway.upstream import Launcher, Upstream
from bastion.launchers.plan import NotALauncher, plan_launch
from bastion.model import REQUEST, TO_SERVER, Identity, Interceptor
from bastion.state import MemoryStore, StateStore, StateUnavailable
from bastion.transport.stdio import WriteBatch

if TYPE_CHECKING:
    from bastion.policy.interceptors import PolicyRuntime
    from bastion.reload import ReloadOutcome, Reloader

log = logging.getLogger("bastion.gateway")

SERVER_INFO = {"name": "bastion", "version": __version__}
__all__ = ["DECLARED_TO_SERVERS", "Gateway", "RELAYABLE_CLIENT_CAPABILITIES", "SERVER_INFO", "server_catalog"]
# What handshake-era servers are told the client supports. They start with Bastion, before any client connects,
# so they are told everything Bastion can relay; a request the connected client did not declare is refused then.
DECLARED_TO_SERVERS: dict[str, Any] = {"sampling": {}, "elicitation": {}, "roots": {"listChanged": True}}


class Gateway:
    # What a server tells the gateway (the gateway is every Upstream's listener) goes straight to the part whose
    # job it is; these are that part's own methods, set in __init__, so a message pays no call of the gateway's.
    upstream_notification: Callable[..., None]  # the relay, toward the client it belongs to
    upstream_request: Callable[..., Awaitable[dict[str, Any]]]  # the relay, to the client whose call asked
    # Which server a client's request would go to (the router's answer), for a frontend's per-server bounds.
    server_for: Callable[[str | None, Mapping[str, Any]], str | None]
    drive_input_required: Callable[..., Awaitable[dict[str, Any]]]  # a modern server's rounds for a legacy client

    def __init__(
        self,
        config: GatewayConfig,
        *,
        catalog: Catalog | None = None,
        policy: PolicyRuntime | None = None,
        outermost: Sequence[Interceptor] = (),
        exposure: Sequence[Interceptor] = (),
        screens: Sequence[Interceptor] = (),
        interceptors: Sequence[Interceptor] = (),
        tool_index: Any = None,
        launcher: Launcher = launch_server,
        credentials: CredentialSource | None = None,
        observer: Any = None,
        state: StateStore | None = None,
    ) -> None:
        """Built by ``bastion.compose.build_gateway``, which builds the policy, the exposure and the tool index
        from ``config``; the chain is ``outermost`` (the metrics' meter, so it sees every refusal),
        ``exposure``, ``screens`` (what decides whether a definition is served at all), the policy's interceptors, then
        ``interceptors``; ``observer`` (``bastion.observability``: tracing, the request facts of JSON logs) watches
        each client request, its steps and its server call, and is closed last; ``state`` is what replicas share
        (bastion/state/: this process's memory unless ``[state] url`` names a store), closed with the gateway."""
        if config.policy is not None and policy is None:
            raise ValueError("the configuration has a policy and none was given: build the gateway with "
                             "bastion.compose.build_gateway, which builds it")
        if config.tools.exposure in ("search", "auto") and not exposure:
            raise ValueError("the configuration asks for search exposure and none was given: build the gateway with "
                             "bastion.compose.build_gateway, which builds it")
        self.config = config
        enabled = {name: cfg for name, cfg in config.servers.items() if cfg.enabled}
        self.catalog = catalog if catalog is not None else server_catalog(config)
        # Shared by every pipe Bastion reads and writes, clients' and servers' alike: a frame is written while the
        # chunk that caused it is handled, and the frame may go to any of them.
        self.writes = WriteBatch()
        # What each upstream connection authenticates with (never a caller's own token): Bastion's own here.
        # Per-user authorization-code flows: their callbacks are served by the HTTP frontend or a loopback listener.
        self.authorization_codes = AuthorizationCodes(self.identity.name)
        # With a store replicas share, the tokens are kept in it (encrypted), so that every replica uses one.
        self.credentials = credentials if credentials is not None else CredentialSource(
            store=token_store_opener(state), authorization_code=self.authorization_codes)
        self._launcher = launcher
        self._instances = InstanceListener(self)
        self.upstreams = {name: self._upstream(name, cfg) for name, cfg in enabled.items()}
        # Servers whose scope is per_identity or per_session: each caller's calls go to an instance of its own;
        # the instance above serves only Bastion itself (the catalog).
        self.pools = {name: self._pool(name, cfg) for name, cfg in enabled.items() if cfg.scope != "shared"}
        # What ``reload`` asks (bastion/reload.py, set by the composition root); None: this gateway cannot reload.
        self.reloader: Reloader | None = None
        self._declared: dict[str, Any] = DECLARED_TO_SERVERS
        # Servers a reload removed or restarted, still finishing the calls they had: closed with the gateway.
        self._retiring: set[asyncio.Task[None]] = set()
        self._tool_index = tool_index
        self.policy = policy
        self.state: StateStore = state if state is not None else MemoryStore()
        # The gateway's metrics (bastion/observability), attached by the composition root; None when they are off.
        self.metrics: Any = None
        self._connections: dict[str, ConnectedClient] = {}
        # Connections are told apart by a counter under a random prefix of this gateway's own: unique across runs
        # (audit records name them), at no random draw per connection (a 2026-07-28 HTTP POST is one).
        self._connection_prefix = uuid.uuid4().hex[:16]
        self._connection_count = itertools.count(1)
        self._started = False
        self.closing = False  # set once close begins: a reload then applies nothing
        # 2026-07-28 clients' calls in flight, where a handshake-era server's question to the client waits.
        self.inputs = InputBridge()

        # The parts, one job each.
        self.subscriptions = Subscriptions(self.catalog, self.upstreams)
        self.log_levels = LogLevels(self._connections, self.upstreams, self.pools)
        self.refresh = CatalogRefresh(self.catalog, self._connections)
        # The one path of every message, both ways, from every frontend and the host API, compiled per route; its
        # last step for a client's request is the router. Where nothing on a tools/call's route reads its result,
        # the result is passed on as the bytes its server sent; where nothing reads its params, its arguments reach
        # the server as the bytes the client sent (``takes_raw_params``: the frontend then leaves them undecoded).
        self._outermost = tuple(outermost)
        self._exposure = tuple(exposure)
        self._innermost = tuple(interceptors)
        self.observer = observer
        self.chain = self._chain(policy, screens, ())
        self.relay = Relay(self.chain, self.catalog, self._connections, self.inputs, self.subscriptions,
                           self.refresh, lambda: self.identity)
        self.input_rounds = InputRounds(self.upstreams, self.pools, self.relay.toward_client)
        self.router = Router(config, self.catalog, self.upstreams, self.pools, self.subscriptions,
                             self.input_rounds, self._catalog_may_grow, self.relay.notices.pending,
                             self.log_levels, lists_fetched=self.refresh.wait, observer=observer,
                             lists_announced=self.refresh.announced_under_way)
        self.handle = self.chain.handle
        self.takes_raw_params = self.chain.route(TO_SERVER, REQUEST, "tools/call").raw_params

        self.upstream_notification = self.relay.notification
        self.upstream_request = self.relay.request
        self.server_for = self.router.server_for
        self.drive_input_required = self.input_rounds.drive

    def _chain(self, policy: PolicyRuntime | None, screens: Sequence[Interceptor],
               inner: Sequence[Interceptor]) -> Chain:
        return Chain([*self._outermost, *self._exposure, *screens, *(policy.interceptors if policy else ()), *inner,
                      *self._innermost],
                     lambda raw_results: partial(self.router.route, raw_results=True) if raw_results
                     else self.router.route, self.observer)

    def _upstream(self, name: str, cfg: ServerConfig) -> Upstream:
        return Upstream(name, cfg, self, self._launcher, self.config.max_message_bytes, self.writes,
                        credentials=self.credentials.for_server(name, cfg, None))

    def _pool(self, name: str, cfg: ServerConfig) -> UpstreamPool:
        return UpstreamPool(name, cfg, self._instance_maker(name, cfg, self._instances, self._launcher))

    # ------------------------------------------------------------------------------------------ reloading
    async def reload(self, *, identity: Identity | None = None, cause: str = "asked") -> ReloadOutcome:
        """Read the configuration file again and apply it without dropping a session (bastion/reload.py): the web
        console's "reload" action, SIGHUP and the file watch all come here, one reload at a time.

        ``identity`` is who asked (audited as ``admin/reload``; None: this process itself, for a signal or the
        file watch), ``cause`` what the log says asked ("SIGHUP", "the file watch", "the console"). Returns a
        ``ReloadOutcome``: ``applied`` (True, or False with ``error``, the file, key and fix, when the new
        configuration was refused and the running one stays), the servers ``added``, ``removed`` and
        ``restarted``, whether the policy was reloaded, and ``needs_restart``, the keys whose change waits for a
        restart. Never raises for a bad file."""
        if self.reloader is None:
            raise RuntimeError("this gateway was built without a reloader: build it with bastion.compose.build_gateway")
        return await self.reloader.reload(identity=identity, cause=cause)

    def use_chain(self, policy: PolicyRuntime | None, screens: Sequence[Interceptor],
                  inner: Sequence[Interceptor]) -> None:
        """A reloaded policy and guardrails: a new chain, swapped in for every message from now on. A message
        already on its way keeps the route it entered (its handlers are the old chain's), so a call in flight
        finishes under the configuration it started with."""
        chain = self._chain(policy, screens, inner)
        self.policy = policy
        self.chain = chain
        self.relay.use_chain(chain)
        self.takes_raw_params = chain.route(TO_SERVER, REQUEST, "tools/call").raw_params
        self.handle = chain.handle

    def use_servers(self, config: GatewayConfig, restarted: set[str]) -> tuple[list[str], list[str]]:
        """Take a reloaded configuration's servers: new ones start, those no longer named or in ``restarted``
        stop once the calls they have finish, an unchanged one keeps running (and its sessions). The kinds of list
        whose catalog changed are announced to every client (the new servers' own are, as ever, once their lists
        come). Returns (added, removed)."""
        old = self.upstreams
        enabled = {name: cfg for name, cfg in config.servers.items() if cfg.enabled}
        added = [name for name in enabled if name not in old]
        removed = [name for name in old if name not in enabled]
        # Built before anything changes: one that cannot be built leaves the running set as it was.
        fresh = {name: self._upstream(name, enabled[name]) for name in [*added, *restarted]}
        pools = {name: self._pool(name, enabled[name]) for name in fresh if enabled[name].scope != "shared"}
        self.config = config
        for name in [*removed, *restarted]:
            self.refresh.forget(name)
            self._retire(old.pop(name), self.pools.pop(name, None))
        old.update(fresh)
        self.pools.update(pools)
        for upstream in fresh.values():
            if self._started:
                upstream.client_capabilities = dict(self._declared)
                upstream.start()
        self.router.configure(config)
        for kind in self.catalog.set_servers(server_facts(config), restarted):
            self.refresh.tell(kind)
        return added, removed

    def _retire(self, upstream: Upstream, pool: UpstreamPool | None) -> None:
        async def retire() -> None:
            try:
                # Its calls under way finish first, each within the request_timeout it was sent with.
                while upstream.busy() or (pool is not None and pool.busy()):
                    await asyncio.sleep(0.05)
            finally:  # and when the gateway closes meanwhile
                await asyncio.gather(upstream.close(), *((pool.close(),) if pool is not None else ()),
                                     return_exceptions=True)

        task = asyncio.get_running_loop().create_task(retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def upstream_ready(self, upstream: Upstream) -> None:
        """A server is ready (first started or restarted): the catalog's refresh fetches its lists, and it is asked
        for the log level its clients want (a new process knows none)."""
        if self.upstreams.get(upstream.name) is not upstream:
            return  # one a reload retired, restarted while it finishes its calls: its lists are no longer the catalog's
        self.refresh.upstream_ready(upstream)
        self.log_levels.upstream_ready(upstream)

    # ------------------------------------------------------------------------------------------ running
    def start(self, client_capabilities: Mapping[str, Any] | None = None) -> None:
        """Start every server, in parallel, declaring to each the client capabilities Bastion can relay (by
        default all of them: servers start before any client connects)."""
        if self._started:
            return
        self._started = True
        declared = self._declared = DECLARED_TO_SERVERS if client_capabilities is None else \
            relayable(client_capabilities)
        for upstream in self.upstreams.values():
            upstream.client_capabilities = dict(declared)
            upstream.start()
        if self.state.shared:
            task = asyncio.ensure_future(self._ask_state())
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _ask_state(self) -> None:
        """Said once at the start: whether the shared state answers. One that does not is no reason not to start:
        /readyz says not ready and what needs the state is refused until it answers, with no restart."""
        try:
            await self.state.ping()
        except StateUnavailable as error:
            log.warning("%s; the gateway starts anyway: /readyz says not ready, and calls that need the shared "
                        "state are refused until it answers", error)
        else:
            log.info("shared state: %s", getattr(self.state, "where", "answers"))

    async def wait_ready(self, timeout: float | None = None, *, report: bool = True) -> None:
        """Wait until every server is ready with its lists fetched, or has failed to start, or ``timeout`` passes
        (``ready_timeout`` by default: a client's start waits that long at most; later servers join with
        list_changed). ``report`` logs the servers still missing then."""
        await self._wait_for_servers(lambda u: u.settled.wait(), timeout or self.config.ready_timeout)
        if not report:
            return
        for name, upstream in self.upstreams.items():
            # A server whose start failed has said why, once, and says what happens next itself.
            if upstream.status in ("starting", "restarting"):
                log.warning("server %s is not ready yet (%s); it joins when it is", name,
                            upstream.doing or upstream.failure or "starting")

    def starting_servers(self) -> list[tuple[str, str]]:
        """The servers not ready yet that have never been (none of their starts failed), with what each is doing
        ("installing PKG VERSION for server NAME", "starting"): their tools are not in the catalog yet."""
        return [(name, upstream.doing or "starting") for name, upstream in self.upstreams.items()
                if upstream.status == "starting"]

    def servers_settled(self) -> bool:
        """Whether ``wait_ready`` has nothing left to wait for: every server is ready with its lists fetched, or has
        failed to start."""
        return all(u.settled.is_set() for u in self.upstreams.values()) and self.refresh.settled()

    async def wait_started(self) -> None:
        """Wait until every server is ready with its lists fetched, or has failed to start within its own
        ``startup_timeout``: for one-shot commands, which have no list_changed to take a late server in."""
        await self._wait_for_servers(lambda u: u.wait_started(), None)

    async def _wait_for_servers(self, started: Callable[[Upstream], Awaitable[Any]], timeout: float | None) -> None:
        async def one(upstream: Upstream) -> None:
            await started(upstream)
            if upstream.ready.is_set():
                await self.refresh.wait(upstream.name)

        waits = [asyncio.create_task(one(u)) for u in self.upstreams.values()]
        if not waits:
            return
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for task in pending:
            task.cancel()

    async def _catalog_may_grow(self) -> bool:
        """Before calling a name unknown, wait for servers still starting: the name may be theirs."""
        if not self._started or (all(u.ready.is_set() or u.settled.is_set() for u in self.upstreams.values())
                                 and self.refresh.settled()):  # a server just ready: its lists may be on their way
            return False
        await self.wait_ready(report=False)  # the client's start said which servers were missing
        return True

    async def close(self) -> None:
        self.closing = True
        self.refresh.close()
        self.log_levels.close()
        self.relay.close()
        self.inputs.close()
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*(u.close() for u in self.upstreams.values()), *(p.close() for p in self.pools.values()),
                             *self._retiring, return_exceptions=True)
        await self.authorization_codes.close()  # the loopback listener for authorization redirects, if one opened
        if self.policy is not None:
            await self.policy.aclose()
        if self._tool_index is not None:
            self._tool_index.close()
        if self.observer is not None:
            await self.observer.aclose()  # the spans still batched are sent now, or lost with the process
        await self.state.aclose()

    def tool_index(self) -> Any:
        """The search index over this gateway's catalog, as ``build_gateway`` gave it (its ``current()`` is the
        index as of the catalog now)."""
        if self._tool_index is None:
            raise RuntimeError("this gateway was built without a tool index: build it with "
                               "bastion.compose.build_gateway")
        return self._tool_index

    def upstream_down(self, upstream: Upstream, reason: str) -> None:
        # The upstream itself says why at WARNING, with its last stderr lines and what happens next.
        log.debug("server %s is down: %s", upstream.name, reason)
        if upstream.failed_starts == 1:
            # No longer starting: the exposure "auto" may now show every tool rather than search mode, with no
            # change to the catalog to announce it.
            self.refresh.tell("tools")

    def _instance_maker(self, name: str, config: Any, listener: InstanceListener,
                        launcher: Launcher) -> Callable[[Identity], Upstream]:
        def make(identity: Identity) -> Upstream:
            instance = Upstream(name, config, listener, launcher, self.config.max_message_bytes, self.writes,
                                credentials=self.credentials.for_server(name, config, identity),
                                secrets=self.credentials.identity_secrets(name, config, identity))
            instance.client_capabilities = dict(self.upstreams[name].client_capabilities)
            return instance
        return make

    # ------------------------------------------------------------------------------------------ clients
    @property
    def identity(self) -> Identity:
        """Who a stdio client is: a pipe carries no credentials, so the policy section names it."""
        if self.config.policy is None:
            return Identity("local", ("local",))
        configured = self.config.policy.identity
        return Identity(configured.name, tuple(configured.groups))

    def connection_id(self) -> str:
        """A new client connection's id, never given to another connection of this gateway or of another run."""
        return f"{self._connection_prefix}-{next(self._connection_count)}"

    def attach(self, connection: ConnectedClient) -> None:
        self._connections[connection.id] = connection

    def detach(self, connection: ConnectedClient) -> None:
        self._connections.pop(connection.id, None)
        self.log_levels.client_left()
        self.subscriptions.drop_connection(connection.id)
        for pool in self.pools.values():
            pool.end_session_soon(connection.id)

    def server_capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = {"tools": {"listChanged": True}, "logging": {}}
        ups = [u.capabilities for u in self.upstreams.values()]
        # A server not heard from yet may bring prompts and resources when it joins: a client told of them now
        # takes the list_changed that announces them (their lists are empty until then).
        unheard = any(not u.capabilities and not u.stopped for u in self.upstreams.values())
        if unheard or any("prompts" in c for c in ups):
            caps["prompts"] = {"listChanged": True}
        if unheard or any("resources" in c for c in ups):
            caps["resources"] = {"subscribe": True, "listChanged": True}
        if any("completions" in c for c in ups):
            caps["completions"] = {}
        return caps

    def instructions(self) -> str | None:
        parts = [f"[{name}] {u.instructions}" for name, u in self.upstreams.items() if u.instructions]
        return "\n\n".join(parts) if parts else None


def launched_package(server: ServerConfig) -> str | None:
    """The package a launcher entry (``npx -y PKG``, ``uvx PKG``) runs, None for any other entry, and "" (no
    package) for a launcher written in a form Bastion does not read: what that runs is not known."""
    if server.command is None:
        return None
    try:
        plan = plan_launch(server.command, server.args)
    except NotALauncher:
        return ""  # names no reference package
    return plan.package if plan is not None else None


def server_catalog(config: GatewayConfig) -> Catalog:
    """An empty catalog of the enabled servers of ``config``, which their lists fill as they come."""
    return Catalog(server_facts(config))


def server_facts(config: GatewayConfig) -> list[ServerFacts]:
    """What the catalog knows of each enabled server of ``config``."""
    guardrails = config.guardrails
    return [
        ServerFacts(name, name if cfg.prefix is None else cfg.prefix, cfg.trust,
                    server_nature(command=cfg.command, args=cfg.args, launched=launched_package(cfg),
                                  remote=cfg.is_remote,
                                  sandboxed=cfg.sandbox.sandboxed, network=cfg.sandbox.network,
                                  marked_untrusted=cfg.trust == "untrusted" and "trust" in cfg.model_fields_set,
                                  pinned=guardrails is not None and guardrails.switch("pinning", name) != "off"),
                    frozenset(cfg.auto_approve))
        for name, cfg in config.servers.items() if cfg.enabled
    ]
