"""Every module that adds subcommands to ``bastion``; each exposes ``register(subparsers)``."""

from __future__ import annotations

import importlib
from typing import Any, Callable

MODULES: tuple[str, ...] = ("bastion.cli.gateway", "bastion.cli.policy", "bastion.cli.sandbox",
                           "bastion.cli.clients", "bastion.cli.servers", "bastion.cli.serve",
                           "bastion.cli.pins", "bastion.cli.guard", "bastion.cli.keys",
                           "bastion.cli.credentials", "bastion.cli.console")


def registrars() -> list[Callable[[Any], None]]:
    return [importlib.import_module(name).register for name in MODULES]
