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
from bastion.launchers.install import Installed, PackageInstallFailed, install, packages_dir
from bastion.launchers.lock import LockEntry, LockFileError, lock_path, read_lock, record
from bastion.launchers.plan import LaunchPlan, NotALauncher, plan_launch
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
    lock_file = lock_path(config.config_file)
    locked = await asyncio.to_thread(_locked_entry, lock_file, name, plan)
    installed = await _install(name, plan, locked, env)
    stale = locked is None or locked.version != installed.version or (installed.tree and not locked.tree)
    if lock_file is not None and stale:
        entry = LockEntry(installed.ecosystem, installed.package, plan.key, installed.version, installed.integrity,
                          installed.tree)
        try:
            await asyncio.to_thread(record, lock_file, {name: entry})
            log.info("server %s: locked %s %s in %s", name, installed.package, installed.version, lock_file)
        except LockFileError as exc:
            log.warning("server %s: %s", name, exc)
    return installed_config(config, plan, installed)


def installed_config(config: ServerConfig, plan: LaunchPlan, installed: Installed) -> ServerConfig:
    """``config`` running the installed program, with its install tree visible read-only in the sandbox."""
    update: dict[str, object] = {"command": installed.program, "args": list(plan.args)}
    if config.sandbox.sandboxed and installed.root not in config.sandbox.read_only:
        update["sandbox"] = config.sandbox.model_copy(
            update={"read_only": (*config.sandbox.read_only, installed.root)})
    return config.model_copy(update=update)


async def _install(name: str, plan: LaunchPlan, locked: LockEntry | None,
                   env: Mapping[str, str] | None) -> Installed:
    version = locked.version if locked else None
    label = f"installing {plan.package}" + (f" {version}" if version else "") + f" for server {name}"
    async with step(label):
        installed = await install(plan, packages_dir(state_dir()), os.environ if env is None else env,
                                  version=version, integrity=locked.integrity if locked and locked.integrity else None,
                                  tree=locked.tree if locked else None)
    log.info("server %s: %s %s %s %s, installed in %s", name, plan.launcher, installed.package, installed.version,
             "(locked)" if locked else "(newest)", installed.root)
    return installed


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
    if entry.package != plan.package or entry.ecosystem != plan.ecosystem or entry.requested != plan.key:
        log.info("server %s: the configuration now asks for %s (locked: %s); resolving it again",
                 name, plan.key, entry.requested)
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
    lock_file = lock_path(config.source)
    if lock_file is None:
        raise LockFileError("the built-in configuration has no lock file; give a configuration file")
    plans = launcher_servers(config)
    before = await asyncio.to_thread(read_lock, lock_file)
    chosen = list(names)
    outcomes = await asyncio.gather(*(_install(name, plans[name], None, env) for name in chosen),
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
    return results
