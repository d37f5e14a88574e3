"""From a launcher command line to the installed program the sandbox runs: install or use the lock, then rewrite.

``prepare`` is called for every server start. A server that is not started through a launcher is returned as
it is. One that is gets its package installed (or found in the cache at the locked version), its lock entry
written on first use, and comes back as a ServerConfig whose command is the installed program, whose arguments
are the server's own, and whose sandbox sees the installed tree read-only: the server then needs no network.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from bastion.config import GatewayConfig, ServerConfig, state_dir
from bastion.launchers.environment import InstallEnvironment
from bastion.launchers.install import Installed, PackageInstallFailed, install, packages_dir
from bastion.launchers.lock import (LockEntry, LockFileError, legacy_lock_path, lock_path, read_lock, record,
                                    request_id, user_index_path)
from bastion.launchers.plan import LaunchPlan, NotALauncher, plan_launch
from bastion.launchers.satisfy import unsatisfied
from bastion.progress import step

log = logging.getLogger("bastion.launchers")


async def prepare(name: str, config: ServerConfig, *, env: Mapping[str, str] | None = None) -> ServerConfig:
    """The ServerConfig to spawn for ``config``: itself, or its launcher's package installed and locked."""
    try:
        plan = plan_launch(config.command, config.args)
    except NotALauncher as exc:
        log.warning("server %s: %s; it is started as written, and a sandboxed launcher has no network to fetch "
                    "its package", name, exc)
        return config
    if plan is None:
        return config
    state = state_dir()
    lock_file = lock_path(config.config_file, config.client_file, state)
    own = await asyncio.to_thread(_locked_entry, lock_file, name, plan)
    moved = None  # an entry of the lock an older Bastion left beside a client's file: moved into the state directory
    if own is None and config.client_file and config.config_file is not None:
        moved = await asyncio.to_thread(_locked_entry, legacy_lock_path(config.config_file), name, plan)
    locked = own or moved or await asyncio.to_thread(_user_entry, state, name, plan)
    installs = InstallEnvironment(os.environ if env is None else env)
    try:
        installed = await _install(name, plan, locked, installs)
    except PackageInstallFailed as exc:
        if own is not None or locked is None:
            raise  # this file's own lock is kept to: a changed package is refused, never silently replaced
        # What another configuration locked only saved a resolve (it may have been made for another Python)
        log.warning("server %s: the version locked elsewhere could not be installed here (%s); resolving it again",
                    name, str(exc).splitlines()[0])
        installed = await _install(name, plan, None, installs)
    entry = LockEntry(installed.ecosystem, installed.package, plan.key, installed.version, installed.integrity,
                      installed.tree)
    if lock_file is not None and (moved is not None or _stale(own, installed)):
        try:
            await asyncio.to_thread(record, lock_file, {name: entry})
            log.info("server %s: locked %s %s in %s", name, installed.package, installed.version, lock_file)
        except LockFileError as exc:
            log.warning("server %s: %s", name, exc)
    await asyncio.to_thread(_index_unless_there, state, entry)
    return installed_config(config, plan, installed)


def _stale(locked: LockEntry | None, installed: Installed) -> bool:
    return (locked is None or locked.version != installed.version or locked.integrity != installed.integrity
            or (bool(installed.tree) and dict(locked.tree) != dict(installed.tree)))


def _index(state: Path, entries: Iterable[LockEntry]) -> None:
    """Record what was locked in the user-wide index; it only saves a resolve, so a failure to write it is a note."""
    try:
        record(user_index_path(state), {request_id(entry.ecosystem, entry.requested): entry for entry in entries})
    except LockFileError as exc:
        log.warning("the user-wide lock index: %s", exc)


def _index_unless_there(state: Path, entry: LockEntry) -> None:
    """Keep the user-wide index in step with what this start locked (a file locked before the index existed, an
    index deleted), writing it only when it says something else."""
    index = user_index_path(state)
    try:
        there = read_lock(index).get(request_id(entry.ecosystem, entry.requested))
    except LockFileError as exc:
        # It only saves resolves, and every start would stumble on it again: it is started afresh.
        log.warning("%s; starting it afresh", exc)
        index.unlink(missing_ok=True)
        there = None
    if there != entry:
        _index(state, [entry])


def _user_entry(state: Path, name: str, plan: LaunchPlan) -> LockEntry | None:
    """What another configuration of this user locked for the same request, when it satisfies it."""
    try:
        entry = read_lock(user_index_path(state)).get(request_id(plan.ecosystem, plan.key))
    except LockFileError as exc:
        log.warning("server %s: %s; resolving it again", name, exc)
        return None
    if entry is None or not _same_request(entry, plan):
        return None
    reason = unsatisfied(plan, entry.version, entry.tree)
    if reason is not None:
        log.warning("server %s: the user-wide lock index records a tree for %s that does not satisfy it (%s); "
                    "resolving it again", name, plan.key, reason)
        return None
    log.info("server %s: %s %s is locked for the same request by another configuration; using it", name,
             entry.package, entry.version)
    return entry


def installed_config(config: ServerConfig, plan: LaunchPlan, installed: Installed) -> ServerConfig:
    """``config`` running the installed program, with its install tree visible read-only in the sandbox."""
    update: dict[str, object] = {"command": installed.program, "args": list(plan.args)}
    if config.sandbox.sandboxed and installed.root not in config.sandbox.read_only:
        update["sandbox"] = config.sandbox.model_copy(
            update={"read_only": (*config.sandbox.read_only, installed.root)})
    return config.model_copy(update=update)


async def _install(name: str, plan: LaunchPlan, locked: LockEntry | None, env: InstallEnvironment) -> Installed:
    version = locked.version if locked else None
    label = f"installing {plan.package}" + (f" {version}" if version else "") + f" for server {name}"
    async with step(label):
        installed = await install(plan, packages_dir(state_dir()), env,
                                  version=version, integrity=locked.integrity if locked and locked.integrity else None,
                                  tree=locked.tree if locked else None)
    log.info("server %s: %s %s %s %s, installed in %s", name, plan.launcher, installed.package, installed.version,
             "(locked)" if locked else "(newest)", installed.root)
    return installed


def _same_request(entry: LockEntry, plan: LaunchPlan) -> bool:
    """Whether ``entry`` was locked for what ``plan`` asks (then whether its tree satisfies it is the next question)."""
    return entry.package == plan.package and entry.ecosystem == plan.ecosystem and entry.requested == plan.key


def _locked_entry(lock_file: Path | None, name: str, plan: LaunchPlan) -> LockEntry | None:
    """The lock entry that still matches what the configuration asks for, if any."""
    if lock_file is None:
        return None
    try:
        entry = read_lock(lock_file).get(name)
    except LockFileError as exc:
        raise PackageInstallFailed(str(exc)) from None
    if entry is None:
        return None
    if not _same_request(entry, plan):
        log.info("server %s: the configuration now asks for %s (locked: %s); resolving it again",
                 name, plan.key, entry.requested)
        return None
    reason = unsatisfied(plan, entry.version, entry.tree)
    if reason is not None:
        log.warning("server %s: %s records a tree that does not satisfy %s (%s); refused, resolving and installing "
                    "it again", name, lock_file, plan.key, reason)
        return None
    return entry


@dataclass(frozen=True)
class Change:
    server: str
    package: str
    old: str | None  # the version locked before, None when there was none
    new: str

    def describe(self) -> str:
        if self.old == self.new:
            return f"{self.server}: {self.package} {self.new} (unchanged)"
        return f"{self.server}: {self.package} {self.old or '(not locked)'} -> {self.new}"


def launcher_servers(config: GatewayConfig) -> dict[str, LaunchPlan]:
    """Every enabled server started through a launcher Bastion reads, with its plan."""
    plans: dict[str, LaunchPlan] = {}
    for name, server in config.servers.items():
        if server.command is None:  # a remote server: nothing to install
            continue
        try:
            plan = plan_launch(server.command, server.args)
        except NotALauncher:
            continue
        if plan is not None and server.enabled:
            plans[name] = plan
    return plans


async def update(config: GatewayConfig, names: Iterable[str], *,
                 env: Mapping[str, str] | None = None) -> list[Change | PackageInstallFailed]:
    """Resolve the newest version each named server's request allows, install it and rewrite its lock entry.

    The servers are installed at once; each gets its Change, or the failure that kept it at its locked version.
    """
    lock_file = config_lock_path(config)
    if lock_file is None:
        raise LockFileError("the built-in configuration has no lock file; give a configuration file")
    plans = launcher_servers(config)
    before = await asyncio.to_thread(read_lock, lock_file)
    chosen = list(names)
    installs = InstallEnvironment(os.environ if env is None else env)  # the login shell read once for them all
    outcomes = await asyncio.gather(*(_install(name, plans[name], None, installs) for name in chosen),
                                    return_exceptions=True)
    results: list[Change | PackageInstallFailed] = []
    updates: dict[str, LockEntry] = {}
    for name, outcome in zip(chosen, outcomes, strict=True):
        if isinstance(outcome, PackageInstallFailed):
            results.append(outcome)
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        plan = plans[name]
        updates[name] = LockEntry(outcome.ecosystem, outcome.package, plan.key, outcome.version, outcome.integrity,
                                  outcome.tree)
        old = before.get(name)
        results.append(Change(name, outcome.package, old.version if old and old.package == plan.package else None,
                              outcome.version))
    if updates:
        await asyncio.to_thread(record, lock_file, updates)
        await asyncio.to_thread(_index, state_dir(), updates.values())
    return results


def config_lock_path(config: GatewayConfig) -> Path | None:
    """Where ``config``'s lock file is: beside Bastion's own file, in the state directory for a client's."""
    return lock_path(config.source, config.client_file, state_dir())


def carry_over(sources: Iterable[tuple[str, str, Path]], config: GatewayConfig) -> list[str]:
    """Copy the lock entries of imported servers from their client files' locks into ``config``'s lock, so the
    imported file runs the versions already installed and locked instead of resolving them again.

    ``sources``: (name in ``config``, name in the client file, the client file). Returns the names carried over."""
    lock_file = config_lock_path(config)
    plans = launcher_servers(config)
    if lock_file is None:
        return []
    carried: dict[str, LockEntry] = {}
    for name, old_name, client in sources:
        plan = plans.get(name)
        if plan is None:
            continue
        for path in (lock_path(client.resolve(), True, state_dir()), legacy_lock_path(client)):
            try:
                entry = read_lock(path).get(old_name) if path is not None else None
            except LockFileError as exc:
                log.warning("server %s: %s; not carried over", name, exc)
                continue
            if (entry is not None and _same_request(entry, plan)
                    and unsatisfied(plan, entry.version, entry.tree) is None):
                carried[name] = entry
                break
    if carried:
        record(lock_file, carried)
        _index(state_dir(), carried.values())
    return sorted(carried)
