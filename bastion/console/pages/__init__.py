"""Every page and act of the console, in menu order: a module of pages exports ``PAGES`` and ``ACTS`` (and, when it
has them, ``FEEDS`` and ``ASSETS``), and is listed here once."""

from __future__ import annotations

from bastion.console.pages import approvals, audit, catalog, changes, interventions, live, servers
from bastion.console.layout import ICON, STYLESHEET
from bastion.console.registry import Console

MODULES = (servers, catalog, changes, approvals, audit, interventions, live)


def console() -> Console:
    def every(name: str) -> tuple:
        return tuple(item for module in MODULES for item in getattr(module, name, ()))

    return Console(every("PAGES"), every("ACTS"), every("FEEDS"), (STYLESHEET, ICON, *every("ASSETS")))
