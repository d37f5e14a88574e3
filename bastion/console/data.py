"""What the console shows and acts on, read where the CLI reads it: the running gateways' status files
(``bastion/running.py``), the pins file (``bastion/guardrails/pin_store.py``, what ``bastion pins`` reads), the
approval queue and the audit trail, all on disk. ``bastion console`` is a process apart from the gateways a client
started, so the disk is all it has; ``bastion serve --http`` reads the same files (its own status file, its own
configuration's pins), so both deployments show one thing one way. Every method blocks on the disk: pages call them
on a worker thread (``asyncio.to_thread``)."""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from bastion.console.live import LiveWindow
from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.pin_book import PinBook, server_id
from bastion.guardrails.pin_store import PinStore
from bastion.pin_review import identities, rows, scan_modes
from bastion.guardrails.pin_state import StatePins
from bastion.policy.approval import ApprovalQueue
from bastion.policy.approval_state import StateQueue
from bastion.policy.config import ApprovalConfig, PolicyConfig
from bastion.running import RunningGateway, ask_reload, ask_retry, running_gateways

log = logging.getLogger("bastion.console")

TOKEN_CACHE_KEPT = 20_000


@dataclass(frozen=True)
class ConsoleData:
    """``config``: the configuration the console was started with (its pins file, approval queue, audit trail);
    ``only_pid``: the one gateway to show (``bastion serve --http`` shows itself), None for every running one;
    ``pins_of``: the configuration file whose pins to show (None: every configuration's)."""

    config: Any  # bastion.config.GatewayConfig, or None for the defaults
    only_pid: int | None = None
    running_dir: Path | None = None
    pins_of: str | None = None
    tokens: "TokenCosts" = field(default_factory=lambda: TokenCosts(), compare=False, repr=False)
    # The live figures over the gateway's own metrics: only the console inside the gateway (serve --http) has them.
    live: LiveWindow | None = None
    # ``Gateway.reload(identity=...)`` of the gateway the console runs in (serve --http); None beside stdio gateways,
    # which are asked with SIGHUP instead.
    reload_here: Callable[..., Awaitable[Any]] | None = None
    # The configuration's shared state store and its runner, opened at the first use (when its ``[state]`` names a
    # store replicas share, the pins and the approval queue are there, not on disk).
    _shared: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _opening: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def shared_state(self) -> tuple[Any, Any] | None:
        """(the store, its ``Blocking`` runner) when the configuration's ``[state]`` is shared; else None."""
        with self._opening:
            if "opened" not in self._shared:
                self._shared["opened"] = _open_shared(self.config)
            return self._shared["opened"]

    def close(self) -> None:
        """Close the shared state store and its runner, when they were opened."""
        with self._opening:
            opened = self._shared.pop("opened", None)
        if opened is not None:
            store, blocking = opened
            blocking.run(store.aclose())
            blocking.close()

    # ------------------------------------------------------------------------------------------ servers
    def gateways(self) -> list[RunningGateway]:
        found = running_gateways(self.running_dir)
        return [g for g in found if self.only_pid is None or g.pid == self.only_pid]

    def retry(self, server: str) -> list[int]:
        """Ask every shown gateway with a failed ``server`` to start it again; the pids asked (empty: none has
        such a failed server)."""
        asked = []
        for gateway in self.gateways():
            entry = gateway.servers.get(server)
            if isinstance(entry, dict) and entry.get("status") == "failed":
                ask_retry(gateway, server)
                asked.append(gateway.pid)
        return asked

    def ask_reload(self, pid: int) -> bool:
        """Ask the shown gateway ``pid`` to read its configuration again (SIGHUP, as a person would send it); False
        when no such gateway runs."""
        for gateway in self.gateways():
            if gateway.pid == pid:
                ask_reload(gateway)
                return True
        return False

    # ------------------------------------------------------------------------------------------ pins
    def pins(self) -> PinStore | StatePins:
        shared = self.shared_state()
        if shared is not None:
            return StatePins(*shared)
        guardrails = getattr(self.config, "guardrails", None) or GuardrailsConfig()
        return PinStore(guardrails.pins_path())

    def pin_book(self) -> PinBook:
        return self.pins().load()[0]

    def withheld(self) -> tuple[PinBook, list[dict[str, Any]]]:
        """Every withheld definition (of ``pins_of``'s servers, or of every configuration) with every reason, as
        ``bastion pins diff --json`` gives them."""
        book = self.pin_book()
        servers = identities(book, None, self.pins_of)
        return book, rows(book, servers, None, withheld_only=True,
                          modes=scan_modes(servers, lambda said: log.warning("console: %s", said)))

    def latest_reviews(self) -> dict[tuple[str | None, str, str, str], dict[str, Any]]:
        """The latest review of each definition, by (configuration, server, kind, key)."""
        latest = {}
        for review in self.pins().reviews():
            latest[(review.get("configuration"), review.get("server"), review.get("kind"), review.get("key"))] = review
        return latest

    @staticmethod
    def pin_identity(configuration: str | None, server: str) -> str:
        return server_id(server, configuration)

    def token_cost(self, definition: Any) -> int | None:
        return self.tokens.of(definition)

    # ------------------------------------------------------------------------------------------ approvals, audit, live
    def _policy(self) -> Any:
        """The configuration's policy settings (the defaults without a configuration; None when the policy is off)."""
        return self.config.policy if self.config is not None else PolicyConfig()

    def approval_queue(self) -> ApprovalQueue | StateQueue:
        """The queue the gateways of this configuration wait on (``policy.approval.queue_dir``, or the shared
        state store's)."""
        shared = self.shared_state()
        if shared is not None:
            return StateQueue(*shared)
        policy = self._policy()
        return ApprovalQueue(policy.approval.queue_dir if policy is not None else ApprovalConfig().queue_dir)

    def audit_trail(self) -> str | None:
        """The trail this configuration writes (``policy.audit.path``), None when it writes none."""
        policy = self._policy()
        return policy.audit.path if policy is not None and policy.audit.enabled else None

    def audit_key_file(self) -> str | None:
        """The file of the trail's HMAC key (``policy.audit.key_file``), None without one: read by the process that
        verifies the trail (``audit_worker``), which never makes one."""
        policy = self._policy()
        path = policy.audit.key_file if policy is not None else None
        return str(Path(path).expanduser()) if path else None

    def live_window(self) -> LiveWindow | None:
        return self.live


class TokenCosts:
    """A tool definition's cost in prompt tokens: o200k_base over its canonical JSON, as ``bastion tools stats``
    counts (``bastion/search/economics.py``); remembered by the definition's hash, at most ``TOKEN_CACHE_KEPT``."""

    def __init__(self) -> None:
        self._known: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self._count: Any = None

    def of(self, definition: Any) -> int | None:
        """None when there is no definition to count (the status file left a huge one out)."""
        if not isinstance(definition, dict):
            return None
        from bastion.search.auto import tiktoken_counter
        from bastion.search.canonical import canonical_tool_bytes

        blob = canonical_tool_bytes(definition)
        key = hashlib.sha256(blob).digest()
        with self._lock:
            known = self._known.get(key)
            if known is None:
                if self._count is None:
                    self._count = tiktoken_counter()
                known = self._count(blob)
                if len(self._known) >= TOKEN_CACHE_KEPT:
                    self._known.clear()
                self._known[key] = known
        return known


def _open_shared(config: Any) -> tuple[Any, Any] | None:
    """The store ``config``'s ``[state]`` names, on a runner of its own, when replicas share it; else None."""
    if config is None:
        return None
    from bastion.compose import build_state
    from bastion.state.blocking import Blocking

    async def built() -> Any:
        return build_state(config)  # on the runner's loop: a store's connections belong to the loop using them

    blocking = Blocking()
    store = blocking.run(built())
    if not store.shared:
        blocking.close()
        return None
    return store, blocking  # the runner's thread ends with the process, as the console does
