"""What ``bastion check`` says about launcher servers: those that would need the network when they start.

A server started by ``npx``/``uvx``/``pipx run``/``bunx`` runs offline once its package is installed in Bastion's
cache at the version the lock file records. Until then its first start runs the host's package client, which
reaches the registry; a launcher written in a form Bastion cannot install is started as written and, sandboxed
without network, cannot fetch anything at all.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from bastion.finding import Finding
from bastion.launchers.install import PackageInstallFailed, installed_facts, packages_dir, python_interpreter
from bastion.launchers.lock import (LockEntry, LockFileError, legacy_lock_path, lock_path, read_lock, request_id,
                                    user_index_path)
from bastion.launchers.plan import NotALauncher, plan_launch

if TYPE_CHECKING:
    from pathlib import Path

    from bastion.config import GatewayConfig, ServerConfig
    from bastion.launchers.plan import LaunchPlan

_CLIENT = {"npm": "npm", "python": "pip"}


def installs_its_package(server: "ServerConfig") -> bool:
    """Whether Bastion installs this server's package and runs it, so the launcher itself is never run."""
    if server.command is None:  # a remote server: nothing is installed or run
        return False
    try:
        return plan_launch(server.command, server.args) is not None
    except NotALauncher:
        return False


def launcher_findings(config: "GatewayConfig") -> list[Finding]:
    from bastion.config import state_dir

    servers_key = getattr(config, "servers_key", "servers")
    state = state_dir()
    lock_file = lock_path(config.source, config.client_file, state)
    try:
        locked = read_lock(lock_file) if lock_file is not None else {}
        if config.client_file and config.source is not None:  # what an older Bastion locked beside the file
            locked = {**read_lock(legacy_lock_path(config.source)), **locked}
    except LockFileError as exc:
        return [Finding("error", str(lock_file), str(exc), "delete the lock file, or run `bastion servers update`")]
    try:
        index = read_lock(user_index_path(state))
    except LockFileError:
        index = {}  # it only saves a resolve; a start says what is wrong with it
    cache = packages_dir(state)
    findings: list[Finding] = []
    for name, server in config.servers.items():
        if not server.enabled or server.command is None:
            continue
        where = f"{servers_key}.{name}"
        try:
            plan = plan_launch(server.command, server.args)
        except NotALauncher as exc:
            findings.append(Finding(
                "warning", f"{where}.args", f"{exc}: it is started as written, and the launcher needs the network "
                "at every start, which a sandboxed server does not have",
                "install the package yourself and give its program as the command, or write the plain form "
                "(`npx -y PACKAGE ARGS`, `uvx PACKAGE ARGS`)"))
            continue
        if plan is None:
            continue
        if plan.ecosystem == "npm" and shutil.which("npm", path=os.environ.get("PATH")) is None:
            findings.append(Finding("error", f"{where}.command", f"{plan.launcher} servers are installed with npm, "
                                    "which is not on PATH", "install Node.js (it brings npm)"))
            continue
        entry: LockEntry | None = locked.get(name)
        if entry is None or entry.package != plan.package or entry.requested != plan.key:
            entry = index.get(request_id(plan.ecosystem, plan.key))  # locked for the same request elsewhere
        if entry is None or entry.package != plan.package or entry.requested != plan.key:
            findings.append(Finding(
                "warning", f"{where}.command", f"{plan.launcher} {plan.package} is not locked yet: its first start "
                f"installs it with the host's {_CLIENT[plan.ecosystem]}, which needs the network (the server itself "
                "runs offline in the sandbox)",
                f"run `bastion servers update {name} --config {config.source or 'FILE'}` now, with the network, to "
                "install and lock it"))
        elif not _installed(cache, plan, entry):
            findings.append(Finding(
                "warning", f"{where}.command", f"{plan.package} {entry.version} is locked but not installed in "
                f"{cache}: the next start installs it with the host's {_CLIENT[plan.ecosystem]}, which needs the "
                "network unless its own cache has it", f"start Bastion once with the network, or run "
                f"`bastion servers update {name}` to move it to the newest version"))
    return findings


def _installed(cache: "Path", plan: "LaunchPlan", entry: LockEntry) -> bool:
    try:
        interpreter = python_interpreter(plan, os.environ.get("PATH")) if plan.ecosystem == "python" else ""
    except PackageInstallFailed:
        return False
    return installed_facts(cache, entry.ecosystem, entry.package, entry.version, entry.tree, interpreter) is not None
