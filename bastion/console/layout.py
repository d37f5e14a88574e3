"""The frame around every page (menu, who is logged in, the log-out button, a one-time notice) and the headers every
answer of the console carries: a strict Content-Security-Policy (nothing inline runs, nothing loads from another
origin, no page may frame it), no caching, a referrer only to the console itself (a login link's secret never leaves
in a Referer; "no-referrer" would make a browser send ``Origin: null`` with the console's own forms, which the
Origin checks then refuse)."""

from __future__ import annotations

from importlib import resources
from typing import Iterable

from bastion.console.markup import Html, tag
from bastion.console.registry import Asset
from bastion.model import Identity

CSP = ("default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)

STYLESHEET = Asset("style.css", "text/css; charset=utf-8",
                   resources.files("bastion.console").joinpath("style.css").read_bytes())


def document(title: str, body: Html, *, menu: Iterable[tuple[str, str]] = (), current: str = "",
             who: Identity | None = None, csrf: str | None = None, notice: tuple[str, bool] | None = None) -> bytes:
    """A whole page: ``menu`` is (path, title) of each page; ``notice`` (text, ok) is said once above the body."""
    links = [tag("a", label, href=f"/admin/{path}", class_="current" if path == current else None,
                 aria_current="page" if path == current else None) for path, label in menu]
    account = Html("")
    if who is not None and csrf is not None:
        account = tag("div", tag("span", f"{who.name} ({who.authenticated_by})", class_="who"),
                      tag("form", tag("input", type="hidden", name="csrf", value=csrf),
                          tag("button", "Log out", type="submit"), method="post", action="/admin/logout"),
                      class_="account")
    said = Html("") if notice is None else tag("p", notice[0], class_="notice ok" if notice[1] else "notice refused",
                                               role="status")
    page = tag("html",
               tag("head", Html('<meta charset="utf-8">'),
                   Html('<meta name="viewport" content="width=device-width, initial-scale=1">'),
                   tag("title", f"{title} · Bastion console"),
                   Html('<link rel="stylesheet" href="/admin/static/style.css">')),
               tag("body",
                   tag("header", tag("strong", "Bastion console", class_="brand"), tag("nav", *links), account),
                   tag("main", tag("h1", title), said, body)),
               lang="en")
    return f"<!doctype html>\n{page}\n".encode()


__all__ = ["CSP", "SECURITY_HEADERS", "STYLESHEET", "document"]
