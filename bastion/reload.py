"""Hot reload: the configuration file read again and applied to the running gateway without dropping a session.

The new file is loaded and validated exactly as at start (``bastion.config.load_config``: Bastion's TOML or JSON,
a client's JSON with comments), and the policy and guardrails it describes are built, before anything running is
touched; a file that fails any of that is refused with the usual error (file, key, fix) and the running
configuration stays. Applied, it is one step with no wait inside: servers added start, those removed or changed
stop once their calls under way finish (a changed one starts again under its new entry), an unchanged one keeps
running and its sessions; the catalog follows and clients are told (list_changed); and a new chain, with the new
policy and guardrails compiled in, is swapped in by one assignment. A message already on its way holds the route it
entered, so a call in flight finishes under the configuration it started with.

What only a restart can change (the HTTP listener and its TLS, authentication, the message bound, the exposure,
the audit trail and whether there is a policy at all, the identity of a stdio client) keeps running as it was, and
the reload says which key waits for a restart.

Reloads come from SIGHUP, the file watch (``FileWatch``: a poll of each file's stat, its digest read only when the
stat changed and held still for one more look, all of it off the event loop) and the web console
(``Gateway.reload``); they run one at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from bastion.config import ConfigError, GatewayConfig, load_config
from bastion.model import Identity
from bastion.policy.config import PolicyStartError
from bastion.policy.decision import Decision

if TYPE_CHECKING:
    from bastion.gateway.core import Gateway
    from bastion.guardrails.chain import GuardrailChain
    from bastion.policy.interceptors import PolicyRuntime

    # The policy and guardrails of a configuration, given the running policy (the composition root's builders).
    BuildParts = Callable[[GatewayConfig, "PolicyRuntime | None"], "tuple[PolicyRuntime | None, GuardrailChain]"]

log = logging.getLogger("bastion.reload")

# Who a reload from a signal or the file watch is audited as: the gateway's own process, on its own host.
LOCAL_PROCESS = Identity("local-process", ("local",), authenticated_by="process")
# Top-level keys that a running gateway cannot take without a restart: what they configure was built once, at
# start, by the frontend (listener, TLS, authentication, message bound, file watch) or the composition root (the
# exposure and its index, the state store every part holds).
RESTART_KEYS = ("http", "auth", "max_message_bytes", "tools", "reload", "state")
# Keys of the policy table that a restart alone changes: the audit trail is one writer process holding its hash
# chain, and a stdio client's identity was fixed at its connection.
RESTART_POLICY_KEYS = ("audit", "identity")


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """What one reload did: ``applied``, or refused with ``error`` (the running configuration stays)."""

    applied: bool
    error: str | None = None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    restarted: tuple[str, ...] = ()
    policy_reloaded: bool = False
    needs_restart: tuple[str, ...] = ()

    def describe(self) -> str:
        if not self.applied:
            return f"refused, the running configuration stays: {self.error}"
        parts = [f"{what}: {', '.join(map(shown, names))}" for what, names in (
            ("servers added", self.added), ("removed", self.removed), ("restarted", self.restarted)) if names]
        parts.append("policy and guardrails reloaded" if self.policy_reloaded else "guardrails reloaded")
        return "; ".join(parts)


def shown(name: str) -> str:
    """A server's name as a log line shows it: quoted when it holds what could end the line or forge another."""
    return name if name.isprintable() else repr(name)


def refused(error: str) -> ReloadOutcome:
    return ReloadOutcome(False, error)


def restart_keys(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The keys whose change ``new`` asks for and only a restart makes."""
    keys = [key for key in RESTART_KEYS if getattr(old, key) != getattr(new, key)]
    if (old.policy is None) != (new.policy is None):
        keys.append("policy")
    elif old.policy is not None and new.policy is not None:
        keys += [f"policy.{key}" for key in RESTART_POLICY_KEYS
                 if getattr(old.policy, key) != getattr(new.policy, key)]
    return keys


def as_applied(old: GatewayConfig, new: GatewayConfig, waiting: list[str]) -> GatewayConfig:
    """``new`` with the keys in ``waiting`` as they run now: the configuration the gateway then really runs."""
    top = {key: getattr(old, key) for key in waiting if "." not in key}
    policy = {key.split(".", 1)[1]: getattr(old.policy, key.split(".", 1)[1]) for key in waiting
              if key.startswith("policy.")}
    if policy and new.policy is not None:
        top["policy"] = new.policy.model_copy(update=policy)
    return new.model_copy(update=top) if top else new


def digest(paths: list[Path]) -> str:
    """One digest of the files' contents (a missing file counts as such): what a reload applied, and what the
    watch compares a change with. Blocking: run it off the event loop."""
    hashed = hashlib.sha256()
    for path in paths:
        hashed.update(os.fsencode(path) + b"\0")
        try:
            # Never opened unless a regular file: reading a FIFO put in its place would wait for a writer forever.
            hashed.update(hashlib.sha256(path.read_bytes()).digest() if path.is_file() else b"not a file")
        except OSError:
            hashed.update(b"missing")
    return hashed.hexdigest()


def not_regular(paths: list[Path]) -> Path | None:
    """The first of ``paths`` that exists and is not a regular file (a FIFO, a device, a folder), whose reading
    could hang or mean nothing."""
    return next((path for path in paths if path.exists() and not path.is_file()), None)


def watched_files(config: GatewayConfig) -> list[Path]:
    """The configuration file and the Cedar policy files it names."""
    if config.source is None:
        return []
    return [config.source, *(config.policy.policy_paths() if config.policy is not None else ())]


class Reloader:
    """Reloads one gateway's configuration, one reload at a time (held by the gateway: ``Gateway.reload``)."""

    def __init__(self, gateway: Gateway, build_parts: BuildParts,
                 load: Callable[[Path], GatewayConfig] = load_config) -> None:
        self._gateway = gateway
        self._build_parts = build_parts
        self._load = load
        self._lock = asyncio.Lock()
        # The digest of the files the running configuration was read from: the watch reloads only when it differs.
        self.applied_digest: str | None = None
        # Told once a reload applied a new server set (the status file of `bastion servers` follows it).
        self.listeners: list[Callable[[], None]] = []

    async def reload(self, *, identity: Identity | None = None, cause: str = "asked") -> ReloadOutcome:
        async with self._lock:
            try:
                outcome = await self._reload()
            except Exception as exc:  # noqa: BLE001 - whatever a new file brings, the running gateway stays up
                log.exception("reloading the configuration failed")
                outcome = refused(f"the new configuration could not be applied: {exc!r}")
        self._report(outcome, cause, identity or LOCAL_PROCESS)
        return outcome

    async def _reload(self) -> ReloadOutcome:
        gateway = self._gateway
        old = gateway.config
        source = old.source
        if source is None:
            return refused("this gateway runs the built-in demo configuration: there is no file to read again")
        try:
            new, read_digest = await asyncio.to_thread(self._read, source)
        except ConfigError as exc:
            return refused(str(exc))
        waiting = restart_keys(old, new)
        new = as_applied(old, new, waiting)
        try:
            # On a thread: it reads the Cedar files and compiles the guardrails' rules while clients are served.
            policy, guardrails = await asyncio.to_thread(self._build_parts, new, gateway.policy)
        except PolicyStartError as exc:
            return refused(str(exc))
        if gateway.closing:
            return refused("the gateway is stopping")
        restarted = {name for name, cfg in new.servers.items()
                     if cfg.enabled and name in gateway.upstreams and old.servers.get(name) != cfg}
        # From here to the chain's swap nothing waits: no message sees half of the new configuration.
        added, removed = gateway.use_servers(new, restarted)
        gateway.use_chain(policy, guardrails.screens, guardrails.inner)
        self.applied_digest = read_digest
        for listener in self.listeners:
            listener()
        return ReloadOutcome(True, None, tuple(added), tuple(removed), tuple(sorted(restarted)), policy is not None,
                             tuple(waiting))

    def _read(self, source: Path) -> tuple[GatewayConfig, str]:
        if (odd := not_regular([source])) is not None:
            raise ConfigError(f"{odd}: not a regular file; write the configuration there as a file")
        new = self._load(source)
        files = watched_files(new)
        if (odd := not_regular(files)) is not None:
            raise ConfigError(f"{odd}: not a regular file; policy.policy_files names Cedar files")
        return new, digest(files)

    def _report(self, outcome: ReloadOutcome, cause: str, identity: Identity) -> None:
        source = self._gateway.config.source
        if outcome.applied:
            log.info("reloaded %s (%s): %s", source, cause, outcome.describe())
            for key in outcome.needs_restart:
                log.warning("%s changed in %s: it takes effect only when Bastion restarts; the rest is applied",
                            key, source)
        else:
            log.error("reload (%s): %s", cause, outcome.describe())
        policy = self._gateway.policy
        if policy is not None:
            decision = Decision.allow("reload", f"{cause}: {outcome.describe()}")
            policy.record_admin_action(identity, "reload", str(source) if source else None, decision,
                                       0 if outcome.applied else 1)


class FileWatch:
    """Reloads when a watched file changed: each file's stat (mtime, size, inode) looked at every ``interval``
    seconds on a thread; a change is taken once two looks agree (a file being written, or renamed into place, has
    settled), and applied only when the files' digest differs from the running configuration's. A deleted file
    keeps the running configuration, with a warning, until it is back."""

    def __init__(self, files: Callable[[], list[Path]], interval: float, reloader: Reloader,
                 reload: Callable[[], Awaitable[Any]]) -> None:
        self._files = files
        self._interval = interval
        self._reloader = reloader
        self._reload = reload

    async def run(self) -> None:
        files = self._files()
        if self._reloader.applied_digest is None:
            self._reloader.applied_digest = await asyncio.to_thread(digest, files)
        seen = await asyncio.to_thread(_stats, files)
        candidate: dict[Path, tuple[int, int, int] | None] | None = None
        while True:
            await asyncio.sleep(self._interval)
            files = self._files()
            now = await asyncio.to_thread(_stats, files)
            if now == seen:
                candidate = None
                continue
            if now != candidate:  # still changing, or a first look at the change: one more look
                candidate = now
                continue
            seen, candidate = now, None
            missing = [str(path) for path, stat in now.items() if stat is None]
            if missing:
                log.warning("%s: deleted or unreadable; the running configuration stays until it is back",
                            ", ".join(missing))
                continue
            if await asyncio.to_thread(digest, files) != self._reloader.applied_digest:
                await self._reload()


def _stats(files: list[Path]) -> dict[Path, tuple[int, int, int] | None]:
    found: dict[Path, tuple[int, int, int] | None] = {}
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            found[path] = None
        else:
            found[path] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    return found
