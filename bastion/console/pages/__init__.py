"""Every page and act of the console, in menu order: a module of pages exports ``PAGES`` and ``ACTS``, and is listed
here once."""

from __future__ import annotations

from bastion.console.pages import approvals, audit, catalog, changes, interventions, live, servers
from bastion.console.registry import Console

MODULES = (servers, catalog, changes, approvals, audit, interventions, live)


def console() -> Console:
    return Console(tuple(p for m in MODULES for p in m.PAGES), tuple(a for m in MODULES for a in m.ACTS))
