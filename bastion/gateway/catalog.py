"""The federated catalog: every server's tools, prompts, resources and templates under client-facing names."""

from __future__ import annotations

import base64
import binascii
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Sequence

import orjson

from bastion.clients.known_tools import ServerNature, reads_only
from bastion.gateway.naming import Named, assign_names
from bastion.model import ToolEntry

log = logging.getLogger("bastion.catalog")

KINDS = ("tools", "prompts", "resources", "resourceTemplates")
# A client's list method -> (catalog kind, result key, the server capability that says the server has them)
LISTS = {
    "tools/list": ("tools", "tools", "tools"),
    "prompts/list": ("prompts", "prompts", "prompts"),
    "resources/list": ("resources", "resources", "resources"),
    "resources/templates/list": ("resourceTemplates", "resourceTemplates", "resources"),
}


@dataclass(frozen=True, slots=True)
class ServerFacts:
    name: str
    prefix: str
    trust: str
    nature: ServerNature = ServerNature()
    auto_approve: frozenset[str] = frozenset()


@dataclass(slots=True)
class _ServerItems:
    tools: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    resourceTemplates: list[dict[str, Any]] = field(default_factory=list)

# A contested name stays with the server of higher trust (bastion.gateway.naming.owner).
TRUST_STANDING = {"untrusted": 0, "reviewed": 1, "trusted": 2}


class BadCursor(ValueError):
    pass


class Catalog:
    """Implements ``CatalogView`` for the pipeline; rebuilt whenever a server's lists change."""

    def __init__(self, servers: Sequence[ServerFacts]) -> None:
        self._servers = {s.name: s for s in servers}
        self._order = [s.name for s in servers]
        self._items = {s.name: _ServerItems() for s in servers}
        self.version = 0
        self._tools: dict[str, ToolEntry] = {}
        self._tool_list: list[ToolEntry] = []
        self._tool_definitions: list[dict[str, Any]] = []
        self._prompts: dict[str, Named] = {}
        self._prompt_list: list[dict[str, Any]] = []
        self._resource_owner: dict[str, str] = {}
        self._resource_list: list[dict[str, Any]] = []
        self._template_owners: list[_Template] = []

    # ------------------------------------------------------------------------------------------ updates
    def update(self, server: str, kind: str, items: list[dict[str, Any]]) -> bool:
        """Replace one server's list of one kind; returns whether anything the client sees changed.

        An item Bastion could not route, or that would make a client reject the whole list (a tool whose
        ``inputSchema`` is not an object), is left out with a warning, so one bad item costs only itself."""
        items = [item for item in items if _usable(server, kind, item)]
        if kind == "tools":
            # Keys sorted at every depth, once per change: a client's tools/list is the same bytes whatever
            # key order a server writes, so a model provider's prompt cache keeps hitting across restarts.
            # (Not bastion.search.canonical: importing bastion.search loads numpy and the index.)
            items = [orjson.loads(orjson.dumps(item, option=orjson.OPT_SORT_KEYS)) for item in items]
        current = getattr(self._items[server], kind)
        if current == items:
            return False
        setattr(self._items[server], kind, items)
        self.version += 1
        if kind == "tools":
            self._rebuild_tools()
        elif kind == "prompts":
            self._rebuild_prompts()
        elif kind == "resources":
            self._rebuild_resources()
        else:
            self._rebuild_templates()
        return True

    def set_servers(self, servers: Sequence[ServerFacts], restarted: Collection[str] = ()) -> list[str]:
        """Take a reloaded configuration's servers: a server no longer named loses its items, a new one starts with
        none, and one restarted or whose facts changed (prefix, trust) starts again with none (its new process's
        lists fill it, and a call meanwhile waits for it as for any server starting). The kinds whose listing
        changed, so that clients are told."""
        kept = {s.name for s in servers if self._servers.get(s.name) == s and s.name not in restarted}
        changed = [kind for kind in KINDS if any(getattr(items, kind) for name, items in self._items.items()
                                                 if name not in kept)]
        self._servers = {s.name: s for s in servers}
        self._order = [s.name for s in servers]
        self._items = {s.name: self._items[s.name] if s.name in kept else _ServerItems() for s in servers}
        self.version += 1
        self._rebuild_tools()
        self._rebuild_prompts()
        self._rebuild_resources()
        self._rebuild_templates()
        return changed

    def _assign(self, kind: str) -> tuple[dict[str, Named], dict[tuple[str, str], str]]:
        """Client-facing names for every server's tools or prompts, and the way from (server, original) to them."""
        entries = [(s, self._servers[s].prefix, item["name"]) for s in self._order
                   for item in getattr(self._items[s], kind)]
        names, collisions = assign_names(entries, {s: TRUST_STANDING.get(f.trust, 0) for s, f in self._servers.items()})
        for c in collisions:
            log.warning("%s name %r is offered by %s; %s", kind[:-1], c.exposed, " and ".join(c.servers), c.resolution)
        return names, {(n.server, n.original): n.exposed for n in names.values()}

    def _rebuild_tools(self) -> None:
        _, by_origin = self._assign("tools")
        tools: dict[str, ToolEntry] = {}
        for server in self._order:
            for tool in self._items[server].tools:
                exposed = by_origin[(server, tool["name"])]
                definition = {**tool, "name": exposed}
                facts = self._servers[server]
                tools[exposed] = ToolEntry(exposed, server, tool["name"], definition, facts.trust,
                                           reads_only(facts.nature, tool, tool["name"]),
                                           tool["name"] in facts.auto_approve)
        self._tools = tools
        self._tool_list = [tools[name] for name in sorted(tools)]
        # Shared, not copied per request: nothing on the way to a client changes an item of a list (at
        # 10,000 tools a copy per listing cost 5 ms of the event loop, and garbage collections after).
        self._tool_definitions = [entry.definition for entry in self._tool_list]

    def _rebuild_prompts(self) -> None:
        names, by_origin = self._assign("prompts")
        prompts = []
        for server in self._order:
            for prompt in self._items[server].prompts:
                prompts.append({**prompt, "name": by_origin[(server, prompt["name"])]})
        self._prompts = names
        self._prompt_list = sorted(prompts, key=lambda p: p["name"])

    def _standing(self, server: str) -> int:
        return TRUST_STANDING.get(self._servers[server].trust, 0)

    def _rebuild_resources(self) -> None:
        # A URI offered by several servers is read from the one of highest trust, then the first in the configuration:
        # a server of lower trust cannot take a URI from one of higher.
        owners: dict[str, str] = {}
        for server in sorted(self._order, key=self._standing, reverse=True):  # stable: configuration order within
            for resource in self._items[server].resources:
                uri = resource["uri"]
                if uri in owners:
                    if owners[uri] != server:
                        log.warning("resource %s is offered by %s and %s; it is listed and read from %s (%s)", uri,
                                    owners[uri], server, owners[uri], self._why_first(owners[uri], server))
                    continue
                owners[uri] = server
        listed: list[dict[str, Any]] = []  # in configuration order, each URI once, as its owner offers it
        seen: set[str] = set()
        for server in self._order:
            for resource in self._items[server].resources:
                uri = resource["uri"]
                if owners[uri] == server and uri not in seen:
                    seen.add(uri)
                    listed.append(resource)
        self._resource_owner = owners
        self._resource_list = listed

    def _why_first(self, winner: str, other: str) -> str:
        if self._standing(winner) > self._standing(other):
            return f"trusted more: {self._servers[winner].trust} over {self._servers[other].trust}"
        return "listed first in the configuration"

    def _rebuild_templates(self) -> None:
        self._template_owners = [
            _Template(_template_pattern(t["uriTemplate"]), t["uriTemplate"], server, self._standing(server),
                      _specificity(t["uriTemplate"]))
            for server in self._order
            for t in self._items[server].resourceTemplates
        ]
        self._warn_of_overlaps()

    def _warn_of_overlaps(self) -> None:
        """Say which templates of different servers can match the same URI, and which one answers it."""
        templates = self._template_owners
        if len(templates) > OVERLAP_CHECK_LIMIT:
            return
        for index, first in enumerate(templates):
            for second in templates[index + 1:]:
                if first.server == second.server:
                    continue
                for one, other in ((first, second), (second, first)):
                    sample = _sample_uri(other.template)
                    if one.pattern.fullmatch(sample):
                        winner = self._read_through(sample)
                        log.warning("resource templates %s of server %s and %s of server %s overlap (both match %s); "
                                    "such a URI is read from %s (%s)", first.template, first.server,
                                    second.template, second.server, sample, winner[0] if winner else "neither",
                                    "more trusted, then more specific, then listed first")
                        break

    def _read_through(self, uri: str) -> tuple[str, str, str] | None:
        """What answers a read of ``uri``: (server, kind, key), kind ``resources`` (key the URI) or
        ``resourceTemplates`` (key the template). The server of highest trust that offers the URI or a template
        matching it; among those a listed resource before a template, and the most specific template (most literal
        characters) before another; then the first in the configuration."""
        best: tuple[str, str, str] | None = None
        best_rank: tuple[int, int, int] | None = None
        owner = self._resource_owner.get(uri)
        if owner is not None:
            best, best_rank = (owner, "resources", uri), (self._standing(owner), 1, 0)
        for template in self._template_owners:
            rank = (template.standing, 0, template.specificity)
            if (best_rank is None or rank > best_rank) and template.pattern.fullmatch(uri):
                best, best_rank = (template.server, "resourceTemplates", template.template), rank
        return best

    # ------------------------------------------------------------------------------------------ lookups
    def tool(self, exposed_name: str) -> ToolEntry | None:
        return self._tools.get(exposed_name)

    def tools(self) -> Sequence[ToolEntry]:
        return self._tool_list

    def prompt(self, exposed_name: str) -> Named | None:
        return self._prompts.get(exposed_name)

    def prompt_definition(self, exposed_name: str) -> tuple[str, dict[str, Any]] | None:
        """The server and definition of the prompt a client gets under ``exposed_name``, listed or not."""
        named = self._prompts.get(exposed_name)
        if named is None:
            return None
        for prompt in self._items[named.server].prompts:
            if prompt["name"] == named.original:
                return named.server, prompt
        return None

    def resource_definition(self, uri: str) -> tuple[str, str, dict[str, Any]] | None:
        """What a read of ``uri`` is answered from, listed or not: the server, the kind (``resources`` or
        ``resourceTemplates``) and the definition of the resource it names or the template it matches."""
        found = self._read_through(uri)
        if found is None:
            return None
        server, kind, key = found
        field = "uri" if kind == "resources" else "uriTemplate"
        for definition in getattr(self._items[server], kind):
            if definition[field] == key:
                return server, kind, definition
        return None

    def server_trust(self, server: str) -> str | None:
        """The configured trust level of ``server``; None for a name that is no server of this catalog."""
        facts = self._servers.get(server)
        return facts.trust if facts is not None else None

    def server_taints(self, server: str) -> str | None:
        """Why everything ``server`` answers may steer the model (open world, network, the user's mark); None when
        only what the injection scan flags taints, or for a name that is no server of this catalog."""
        facts = self._servers.get(server)
        return facts.nature.taints if facts is not None else None

    def resource_owner(self, uri: str) -> str | None:
        found = self._read_through(uri)
        return found[0] if found is not None else None

    def template_owner(self, uri_template: str) -> str | None:
        owners = [t for t in self._template_owners if t.template == uri_template]
        if owners:
            return max(owners, key=lambda t: t.standing).server  # max keeps the first of equals
        return self.resource_owner(uri_template)

    def listing(self, kind: str) -> list[dict[str, Any]]:
        if kind == "tools":
            return self._tool_definitions
        if kind == "prompts":
            return self._prompt_list
        if kind == "resources":
            return self._resource_list
        return [item for server in self._order for item in getattr(self._items[server], kind)]

    def server_items(self, server: str, kind: str) -> list[dict[str, Any]]:
        return getattr(self._items[server], kind)


_KEY_FIELD = {"tools": "name", "prompts": "name", "resources": "uri", "resourceTemplates": "uriTemplate"}


def _usable(server: str, kind: str, item: dict[str, Any]) -> bool:
    key = _KEY_FIELD[kind]
    value = item.get(key)
    if not isinstance(value, str) or not value:
        problem = f"its {key!r} is {'missing' if value is None else 'not a non-empty string'}"
    elif kind == "tools" and not isinstance(item.get("inputSchema"), dict):
        problem = "its 'inputSchema' is not a JSON object"
    else:
        return True
    log.warning("server %s: one of its %s is left out, as %s: %.200s", server, kind, problem, orjson.dumps(item).decode())
    return False


@dataclass(frozen=True, slots=True)
class _Template:
    pattern: re.Pattern[str]
    template: str
    server: str
    standing: int
    specificity: int


# Templates compared pairwise for overlaps at most (a catalog with more is not checked, only read by the rule).
OVERLAP_CHECK_LIMIT = 200
_EXPRESSION = re.compile(r"\{[^}]*\}")


def _specificity(template: str) -> int:
    """How much of ``template`` is literal: a catch-all ``scheme://{+rest}`` is less specific than
    ``scheme://notes/{id}``."""
    return len(_EXPRESSION.sub("", template))


def _sample_uri(template: str) -> str:
    """A URI ``template`` expands to (each expression as one letter)."""
    return _EXPRESSION.sub("x", template)


def _template_pattern(template: str) -> re.Pattern[str]:
    """A matcher for the URIs an RFC 6570 template can expand to (any expression matches any text)."""
    parts = re.split(r"\{[^}]*\}", template)
    return re.compile(".*".join(re.escape(p) for p in parts), re.DOTALL)


def paginate(items: list[Any], cursor: Any, page_size: int) -> tuple[list[Any], str | None]:
    """One page of ``items`` from an opaque cursor; ``page_size`` 0 means everything at once."""
    offset = 0
    if cursor is not None:
        offset = decode_cursor(cursor)
    if page_size <= 0:
        return (items if offset == 0 else items[offset:]), None
    end = offset + page_size
    return items[offset:end], (encode_cursor(end) if end < len(items) else None)


def encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"o": offset})).decode().rstrip("=")


def decode_cursor(cursor: Any) -> int:
    if not isinstance(cursor, str):
        raise BadCursor("cursor must be a string")
    try:
        data = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        offset = data["o"]
    except (binascii.Error, ValueError, orjson.JSONDecodeError, KeyError, TypeError):
        raise BadCursor(f"invalid cursor {cursor!r}") from None
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise BadCursor(f"invalid cursor {cursor!r}")
    return offset
