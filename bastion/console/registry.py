"""What the console is made of: pages (a GET that reads) and acts (a POST that changes something), each declared
where it is written. ``bastion/console/pages/__init__.py`` lists every module's ``PAGES`` and ``ACTS``; adding a page
is a module with a ``Page`` and one line there.

A page's ``render`` gets a ``View`` and returns its body as ``Html``; an act's ``run`` gets an ``ActRequest`` and
returns an ``Outcome``. The framework (``app.py``) does the rest for both: the session, Cedar's decision
(``view_console`` to read; ``administer`` with ``context.operation`` = the act's name), the CSRF and Origin checks
of an act, its audit record (allowed or refused, with its outcome), and the layout."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from bastion.console.markup import Html, escape, tag
from bastion.model import Identity


@dataclass(frozen=True, slots=True)
class View:
    """What a page is rendered with: who reads it, its query, the data sources, and how to make an act's form."""

    identity: Identity
    query: Mapping[str, str]
    data: Any  # bastion.console.data.ConsoleData
    csrf: str
    path: str  # this page's own path under /admin, e.g. "servers"

    def form(self, act: str, label: str, fields: Mapping[str, Any] | None = None, *, confirm: bool = False,
             class_: str | None = None) -> Html:
        """A button that POSTs ``act`` with ``fields`` (hidden), the session's CSRF token and this page to come back
        to. ``confirm``: a second field the person must tick first, for acts that are hard to undo."""
        hidden = [tag("input", type="hidden", name=key, value=value) for key, value in (fields or {}).items()]
        hidden += [tag("input", type="hidden", name="csrf", value=self.csrf),
                   tag("input", type="hidden", name="back", value=self.path)]
        check = tag("label", tag("input", type="checkbox", name="confirm", value="yes", required=True), " sure")\
            if confirm else Html("")
        return tag("form", *hidden, check, tag("button", label, type="submit"), method="post",
                   action=f"/admin/act/{act}", class_=class_ or "act")


@dataclass(frozen=True, slots=True)
class Page:
    path: str  # under /admin: "servers" is /admin/servers
    title: str
    render: Callable[[View], Awaitable[Html]]
    in_menu: bool = True


@dataclass(frozen=True, slots=True)
class ActRequest:
    identity: Identity
    form: Mapping[str, str]  # the POSTed fields (csrf and back removed)
    data: Any  # bastion.console.data.ConsoleData


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an act did, said to the person on the page it came from; ``status`` is the audit record's outcome
    (0 done; an HTTP-like code when it could not be done)."""

    message: str
    status: int = 0

    @property
    def done(self) -> bool:
        return self.status == 0


@dataclass(frozen=True, slots=True)
class Act:
    name: str  # POST /admin/act/NAME; Cedar's context.operation, and the audit's admin/NAME
    run: Callable[[ActRequest], Awaitable[Outcome]]
    # what it acts on, read from the form, for Cedar's refusal and the audit record (e.g. the server's name)
    target: Callable[[Mapping[str, str]], str | None] = lambda form: None


class BadForm(Exception):
    """An act's form lacks a field or has a bad value: answered 400 with the message, audited as refused."""


def field_of(form: Mapping[str, str], name: str, *, most: int = 512) -> str:
    """A required form field, refused when missing, empty or longer than ``most`` characters."""
    value = form.get(name, "")
    if not value or len(value) > most:
        raise BadForm(f"the form field {name!r} is {'missing' if not value else 'too long'}")
    return value


@dataclass(frozen=True)
class Console:
    """Every page and act, by path and name."""

    pages: tuple[Page, ...]
    acts: tuple[Act, ...]
    page_by_path: dict[str, Page] = field(init=False)
    act_by_name: dict[str, Act] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "page_by_path", {p.path: p for p in self.pages})
        object.__setattr__(self, "act_by_name", {a.name: a for a in self.acts})
        if len(self.page_by_path) != len(self.pages) or len(self.act_by_name) != len(self.acts):
            raise ValueError("two console pages (or acts) share a path (or name)")

    @property
    def home(self) -> str:
        return self.pages[0].path


__all__ = ["Act", "ActRequest", "BadForm", "Console", "Html", "Outcome", "Page", "View", "escape", "field_of", "tag"]
