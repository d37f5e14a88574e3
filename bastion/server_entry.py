"""What of a server's configuration entry is pinned with its definitions, so that a changed entry is reviewed.

A server's tools are pinned on first use; the entry that says which program runs (or which URL answers) is what
makes those tools this server's. An entry edited to start another program, point at another URL, run in another
folder or receive other variables (a hostile edit of a client's configuration file, a copied entry that drifted)
gets the definitions of the one that was trusted unless the entry is pinned too.

Pinned: ``command``, ``args`` (in order: their order is their meaning), the **names** of ``env`` and
``identity_env`` (never values: secrets rotate, and the pins file must hold none), ``cwd``, ``url``, and for a
launcher entry (``npx``, ``uvx``, ``pipx run``, ``bunx``) the package and the version it asks for. Not pinned: what
does not change which code answers (prefix, trust, timeouts, headers' values, the sandbox profile, which its own
guard covers). Order of keys and surrounding whitespace in the file do not count: the form is rebuilt from the
typed entry, names sorted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bastion.guardrails.pin_book import server_id
from bastion.launchers.plan import NotALauncher, plan_launch

if TYPE_CHECKING:
    from bastion.config import GatewayConfig, ServerConfig


def pinned_entry(server: "ServerConfig") -> dict[str, Any]:
    """The entry's pinned form: plain JSON, absent keys left out."""
    if server.url is not None:
        return {"url": server.url.strip()}
    entry: dict[str, Any] = {"command": (server.command or "").strip(), "args": list(server.args)}
    if server.env:
        entry["env"] = sorted(server.env)
    if server.identity_env:
        entry["identity_env"] = sorted(server.identity_env)
    if server.cwd:
        entry["cwd"] = server.cwd.strip()
    try:
        plan = plan_launch(entry["command"], server.args)
    except NotALauncher:
        plan = None
    if plan is not None:
        entry["package"] = plan.package
        entry["version"] = plan.pinned or plan.requested
    return entry


def pinned_entries(config: "GatewayConfig") -> dict[str, dict[str, Any]]:
    """The pinned form of every enabled server's entry, by server name."""
    return {name: pinned_entry(server) for name, server in config.servers.items() if server.enabled}


def pin_identities(config: "GatewayConfig") -> dict[str, str]:
    """The identity each enabled server is pinned under (pin_book.server_id): its configuration file and its name
    there, so that servers of one name in two files never pass for one server that changed; by name alone for a
    configuration that is no file."""
    source = str(config.source) if config.source is not None else None
    return {name: server_id(name, source) for name, server in config.servers.items() if server.enabled}
