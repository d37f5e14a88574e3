"""What the console is made of: pages (a GET that reads) and acts (a POST that changes something), each declared
where it is written. ``bastion/console/pages/__init__.py`` lists every module's ``PAGES`` and ``ACTS``; adding a page
is a module with a ``Page`` and one line there.

A page's ``render`` gets a ``View`` and returns its body as ``Html``; an act's ``run`` gets an ``ActRequest`` and
returns an ``Outcome``; a module may also export ``FEEDS`` (JSON a page's script polls) and ``ASSETS`` (its script or
stylesheet, served from the console itself). The framework (``app.py``) does the rest for both: the session, Cedar's decision
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

    def form(self, act: str, label: str, fields: Mapping[str, Any] | None = None, *, class_: str | None = None) -> Html:
        """A button that POSTs ``act`` with ``fields`` (hidden), the session's CSRF token and this page to come back
        to."""
        hidden = [tag("input", type="hidden", name=key, value=value) for key, value in (fields or {}).items()]
        hidden += [tag("input", type="hidden", name="csrf", value=self.csrf),
                   tag("input", type="hidden", name="back", value=self.path)]
        return tag("form", *hidden, tag("button", label, type="submit"), method="post", action=f"/admin/act/{act}",
                   class_=class_ or "act")


@dataclass(frozen=True, slots=True)
class Page:
    path: str  # under /admin: "servers" is /admin/servers
    title: str
    render: Callable[[View], Awaitable[Html]]
    in_menu: bool = True


@dataclass(frozen=True, slots=True)
class Feed:
    """A read for a page's script to poll (``GET /admin/feed/PATH``, JSON): decided as a page is (``view_console``),
    never cached. ``read`` gets the ``View`` and returns what ``orjson`` can write."""

    path: str
    read: Callable[[View], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Asset:
    """A file a page loads from the console itself (``/admin/static/NAME``): a stylesheet or a script (no script
    runs inline: the Content-Security-Policy allows only these)."""

    name: str
    content_type: str
    body: bytes


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
    feeds: tuple[Feed, ...] = ()
    assets: tuple[Asset, ...] = ()
    page_by_path: dict[str, Page] = field(init=False)
    act_by_name: dict[str, Act] = field(init=False)
    feed_by_path: dict[str, Feed] = field(init=False)
    asset_by_name: dict[str, Asset] = field(init=False)

    def __post_init__(self) -> None:
        for name, items, key in (("page_by_path", self.pages, "path"), ("act_by_name", self.acts, "name"),
                                 ("feed_by_path", self.feeds, "path"), ("asset_by_name", self.assets, "name")):
            by = {getattr(item, key): item for item in items}
            if len(by) != len(items):
                raise ValueError(f"two console {name.split('_')[0]}s share a {key}")
            object.__setattr__(self, name, by)

    @property
    def home(self) -> str:
        return self.pages[0].path


__all__ = ["Act", "ActRequest", "Asset", "BadForm", "Console", "Feed", "Html", "Outcome", "Page", "View", "escape", "field_of", "tag"]
