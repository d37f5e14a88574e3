"""HTML the console writes: everything from outside (tool names, descriptions, arguments, stderr lines, audit
fields) goes through ``escape``; only ``Html`` (markup the console itself composed) is written as it is. A page
builds its body from these parts, so forgetting to escape takes an explicit ``Html(...)`` around outside text."""

from __future__ import annotations

import html
from typing import Any, Iterable


class Html(str):
    """Markup the console composed, written as it is; any other value is escaped."""

    __slots__ = ()


def escape(value: Any) -> Html:
    """``value`` as text inside an element or a quoted attribute: ``<``, ``>``, ``&``, ``"`` and ``'`` escaped."""
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[Any]) -> Html:
    return Html("".join(escape(part) for part in parts))


VOID = frozenset({"input", "br", "hr", "meta", "link", "img"})


def tag(name: str, /, *children: Any, **attributes: Any) -> Html:
    """``<name attributes>children</name>``; attribute values and children escaped unless ``Html``. An attribute
    named with a trailing underscore (``class_``) loses it; ``None`` or ``False`` leaves it out."""
    attrs = "".join(f' {key.rstrip("_").replace("_", "-")}="{escape(value)}"' if value is not True
                    else f' {key.rstrip("_").replace("_", "-")}'
                    for key, value in attributes.items() if value is not None and value is not False)
    if name in VOID:
        return Html(f"<{name}{attrs}>")
    return Html(f"<{name}{attrs}>{join(children)}</{name}>")


def table(headings: Iterable[str], rows: Iterable[Iterable[Any]], empty: str = "nothing here") -> Html:
    """A table of ``rows`` (cells escaped unless ``Html``); ``empty`` said instead when there are none."""
    body = [tag("tr", *(tag("td", cell) for cell in row)) for row in rows]
    if not body:
        return tag("p", empty, class_="empty")
    return tag("table", tag("thead", tag("tr", *(tag("th", h) for h in headings))), tag("tbody", *body))


def pre(text: Any, class_: str | None = None) -> Html:
    return tag("pre", text, class_=class_)
