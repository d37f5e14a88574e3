"""Confused-deputy protection: a server reads through Bastion only what it owns.

Bastion federates servers, so the client can read any server's resources; a server must not use that to reach
another's. A resource link in a server's result (tools/call, prompts/get) that points at a resource another server
owns is replaced by a note saying so, and so is an embedded resource whose URI another server owns (contents a
server passes off as another's, a trusted server's say); a server's ``sampling/createMessage`` that carries another
server's resource (a link or an embedded resource) or asks for every server's context (``includeContext:
"allServers"``) is refused; unless ``[guardrails.cross_server] allow`` lets that server reference that owner.
Ownership is the catalog's: the server that lists the resource, or a template that matches its URI.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Mapping

from bastion.guardrails.config import GuardrailsConfig, Switch
from bastion.guardrails.raw import RawResults
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.guardrails.taint import named
from bastion.model import CatalogView, GatewayError, GatewayRequest, Handler
from bastion.protocol.jsonrpc import RawResponse

SAMPLING = "sampling/createMessage"
DEPUTY_REFUSED = -32600
_RESULTS = frozenset({"tools/call", "prompts/get"})

Owner = Callable[[str], "str | None"]


# ------------------------------------------------------------------------------------------ pure decisions
def result_links(method: str, result: Mapping[str, Any]) -> Iterator[tuple[Any, Any]]:
    """Each resource link and embedded resource of a result, as (what holds it, its key or index there), so it can be
    replaced in place."""
    if method == "tools/call":
        content = result.get("content")
        if isinstance(content, list):
            yield from ((content, i) for i, item in enumerate(content) if reference_uri(item) is not None)
    elif method == "prompts/get":
        messages = result.get("messages")
        for message in messages if isinstance(messages, list) else ():
            if isinstance(message, dict) and reference_uri(message.get("content")) is not None:
                yield message, "content"


def reference_uri(item: Any) -> str | None:
    """The URI a content block names as a resource: a resource link's, or an embedded resource's own ``uri`` (the
    contents a server puts in its answer under a URI, which a client takes for that resource's)."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "resource_link":
        uri = item.get("uri")
    elif kind == "resource" and isinstance(item.get("resource"), dict):
        uri = item["resource"].get("uri")
    else:
        return None
    return uri if isinstance(uri, str) else None


def foreign_owner(uri: str, server: str, owner_of: Owner, allows: Callable[[str, str], bool]) -> str | None:
    """The other server that owns ``uri`` when ``server`` may not reference it; None when it may. A URI with a
    fragment or a query names the resource without them (``vault://config#part`` is vault's ``vault://config``)."""
    owner = owner_of(uri)
    if owner is None:
        bare = uri.split("#", 1)[0].split("?", 1)[0]
        owner = owner_of(bare) if bare != uri else None
    if owner is None or owner == server or allows(server, owner):
        return None
    return owner


def sampling_references(params: Mapping[str, Any]) -> Iterator[str]:
    """The resource URIs a sampling request carries: resource links and embedded resources in its messages,
    within the tool results a message may hold too."""
    messages = params.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        yield from _references(content if isinstance(content, list) else [content])


def _references(items: list[Any]) -> Iterator[str]:
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "resource_link" and isinstance(item.get("uri"), str):
            yield item["uri"]
        elif kind == "resource" and isinstance(item.get("resource"), dict):
            uri = item["resource"].get("uri")
            if isinstance(uri, str):
                yield uri
        elif kind == "tool_result" and isinstance(item.get("content"), list):
            yield from _references(item["content"])


def withheld_link(owner: str, server: str, embedded: bool = False) -> dict[str, Any]:
    if embedded:
        return {"type": "text", "text": f"[Bastion withheld contents that server '{server}' gave as a resource of "
                                        f"server '{owner}': a server may speak only for its own resources]"}
    return {"type": "text", "text": f"[Bastion withheld a link to a resource of server '{owner}': server '{server}' "
                                    "may point only at its own resources]"}


# ------------------------------------------------------------------------------------------ the interceptor
class DeputyGuard:
    """Withholds resource links to other servers' resources from results, and refuses sampling requests that
    reach for another server's resources or context."""

    methods = frozenset({*_RESULTS, SAMPLING})
    # Of a tools/call only the tool's name, which ``named`` reads from the client's JSON too; a server's sampling
    # request is always decoded. A call's result may come as the server's bytes: one without a resource link passes
    # as it is, undecoded (bastion.guardrails.raw).
    reads_params = False
    reads_results = "raw"

    def __init__(self, config: GuardrailsConfig, report: InterventionLog) -> None:
        self._config = config
        self._report = report
        self._mode = Switch(config, "deputy")
        self.raw_results = RawResults()  # the chain gives every guardrail that reads raw results the same one

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        if request.method == SAMPLING:
            if request.server is not None and self._mode(request.server) != "off":
                self._check_sampling(request, request.server)
            return await call_next(request)
        result = await call_next(request)
        if type(result) is RawResponse:
            return self._raw(request, result)
        if request.method in _RESULTS and isinstance(result, dict):
            server = _answering_server(request)
            if server is not None and self._mode(server) != "off":
                self.withhold_foreign_links(request, server, result)
        return result

    def _raw(self, request: GatewayRequest, raw: RawResponse) -> Any:
        if not may_hold_reference(raw):
            return raw
        return self.withhold_in_raw(request, _answering_server(request), raw)

    def withhold_in_raw(self, request: GatewayRequest, server: str | None, raw: RawResponse) -> Any:
        """``raw`` (``server``'s result, still its bytes) with each link to another server's resource withheld: a
        decoded tree when there was one, else what ``RawResults.unchanged`` passes on."""
        if server is None or self._mode(server) == "off":
            return raw
        decoded = self.raw_results.decode(raw)
        if self.withhold_foreign_links(request, server, decoded):
            self.raw_results.changed(raw)
            return decoded
        return self.raw_results.unchanged(raw)

    def _owner_of(self, catalog: CatalogView) -> Owner:
        owner = getattr(catalog, "resource_owner", None)
        return owner if callable(owner) else (lambda uri: None)

    def withhold_foreign_links(self, request: GatewayRequest, server: str, result: dict[str, Any]) -> bool:
        """Replace each link to another server's resource in ``result``; whether there was one."""
        owner_of = self._owner_of(request.catalog)
        allows = self._config.cross_server.allows
        withheld = False
        for holder, index in list(result_links(request.method, result)):
            embedded = holder[index].get("type") == "resource"
            owner = foreign_owner(reference_uri(holder[index]) or "", server, owner_of, allows)
            if owner is None:
                continue
            withheld = True
            holder[index] = withheld_link(owner, server, embedded)
            if embedded:
                self._tell(request, "withheld", server, "foreign-embedded-resource",
                           f"an embedded resource claiming a resource of server '{owner}' in the answer to "
                           f"{request.method}")
            else:
                self._tell(request, "withheld", server, "foreign-resource-link",
                           f"a resource link to a resource of server '{owner}' in the answer to {request.method}")
        return withheld

    def _check_sampling(self, request: GatewayRequest, server: str) -> None:
        params = request.params if isinstance(request.params, dict) else {}
        allows = self._config.cross_server.allows
        if params.get("includeContext") == "allServers" and not allows(server, "*"):
            self._refuse(request, server, "all-servers-context",
                         "includeContext \"allServers\" would give it the context of every other server; ask for "
                         "\"thisServer\" or \"none\"")
        owner_of = self._owner_of(request.catalog)
        for uri in sampling_references(params):
            owner = foreign_owner(uri, server, owner_of, allows)
            if owner is not None:
                self._refuse(request, server, "foreign-resource",
                             f"it carries a resource of server '{owner}'; a server may put only its own resources "
                             "in a sampling request")

    def _refuse(self, request: GatewayRequest, server: str, kind: str, reason: str) -> None:
        self._tell(request, "refused", server, kind, reason)
        raise GatewayError(DEPUTY_REFUSED, f"sampling/createMessage from server {server!r} refused by Bastion: {reason} "
                           "(or allow the pair in [guardrails.cross_server] allow)",
                           {"guardrail": "deputy", "rule": kind})

    def _tell(self, request: GatewayRequest, action: str, server: str, kind: str, detail: str) -> None:
        target = request.method if request.method == SAMPLING else named(request.params, "name")
        self._report.report(Intervention("deputy", action, server, target, kind, kind, detail,
                                         request.session.session_id, request.session.identity))


def _answering_server(request: GatewayRequest) -> str | None:
    name = named(request.params, "name")
    if name is None:
        return None
    if request.method == "tools/call":
        entry = request.catalog.tool(name)
        return entry.server if entry is not None else None
    finder = getattr(request.catalog, "prompt", None)
    found = finder(name) if callable(finder) else None
    return getattr(found, "server", None)


# A resource link, an embedded resource (``"type": "resource"``; the quotes keep a text that merely says "resource"
# from costing a decode), or a \u escape behind which either may hide (as ``raw.may_hold`` reads one word).
_REFERENCE = re.compile(rb'resource_link|"resource"|\\u')


def may_hold_reference(raw: RawResponse) -> bool:
    """Whether ``raw`` may hold a resource link or an embedded resource once decoded; one pass over its frame."""
    return _REFERENCE.search(raw.frame) is not None


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView) -> DeputyGuard | None:
    if not config.on_anywhere("deputy"):
        return None
    return DeputyGuard(config, report)
