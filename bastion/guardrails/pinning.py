"""Tool pinning against rug pulls, trust on first use: what a server changes after it was first seen is withheld.

The first definitions a server offers (its tools, prompts and resource templates, each whole: name, title,
description, every schema and annotation) are pinned in the pins file. A later definition that differs, after a
``list_changed``, a restart or an upgrade, is not served: it is left out of the lists, a call to it is refused with
an error that says what changed, and it waits, in the pins file too, until a person runs ``bastion pins accept``.
A new name that carries a pinned or withheld definition is a rename, and withheld the same way.

Everything is judged against the catalog once per change of it (a call costs a lookup). The pins file is read again whenever something is withheld and a list or a refused call comes,
so an acceptance takes effect without a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shlex
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

import msgspec
import orjson

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.pin_book import (
    ENTRY_KEY,
    ENTRY_KIND,
    RENAMED,
    SINGULAR,
    Observation,
    PinBook,
    Verdict,
    apply,
    item_key,
    reconcile,
    split_id,
    unclaimed,
)
from bastion.guardrails.pin_diff import summary
from bastion.guardrails.pin_state import PinsUnreachable, StatePins
from bastion.guardrails.pin_store import PinStore, PinStoreError, Signature, configuration_gone, now
from bastion.state import StateStore
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import CatalogView, GatewayError, GatewayRequest, Handler, Session, note_withheld_tools

log = logging.getLogger("bastion.guardrails")

INVALID_PARAMS = -32602  # what a call to a tool the client was not offered gets
_LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_TOLD = "guardrails.pinning.told"  # session facts: the withholdings this client was told about
WATCH_SECONDS = 2.0  # how often the pins file is looked at while something is withheld


class NamedItem(Protocol):
    exposed: str
    server: str
    original: str


class PinnedCatalog(CatalogView, Protocol):
    """The gateway's catalog as pinning reads it: besides tools, its prompts and templates and whose they are."""

    version: int  # moves on whenever any list of any server changes

    def listing(self, kind: str) -> list[dict[str, Any]]: ...

    def prompt(self, exposed_name: str) -> NamedItem | None: ...

    def template_owner(self, uri_template: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Withheld:
    """One definition not served, and why, in words for the client and the log."""

    exposed: str  # the name the client would see (a template: its uriTemplate)
    server: str
    kind: str
    key: str
    verdict: Verdict | None  # None: the pins file cannot be read, so nothing can be checked against it
    problem: str = ""
    entry: Verdict | None = None  # the server's configuration entry changed: everything of it is withheld
    configuration: str | None = None  # the configuration file the server is pinned for (None: pinned by name)

    @property
    def reference(self) -> str:
        """The definition as the pins commands name it, with the configuration file that tells namesakes apart."""
        target = f"{self.server}/{self.key}" if self.entry is None else f"{self.server}/{ENTRY_KEY}"
        return target + self._of

    @property
    def accept(self) -> str:
        """What a person runs to trust it: for a changed entry, the whole server (the entry and what it serves)."""
        target = f"{self.server}/{self.key}" if self.entry is None else self.server
        return f"bastion pins accept {target}{self._of}"

    @property
    def _of(self) -> str:
        return "" if self.configuration is None else f" --config {shlex.quote(self.configuration)}"

    @property
    def intervention_kind(self) -> str:
        if self.verdict is None:
            return "unreadable-pins"
        if self.entry is not None:
            return "changed-configuration"
        return "renamed-definition" if self.verdict.status == RENAMED else "changed-definition"

    def sentence(self) -> str:
        if self.kind == ENTRY_KIND:
            what = f"server {self.server!r} is withheld"
        else:
            what = f"{SINGULAR[self.kind]} {self.exposed!r} of server {self.server!r} is withheld"
        if self.verdict is None:
            return f"{what}: it cannot be checked against the pinned definitions: {self.problem}"
        if self.entry is not None:
            since = f" on {self.entry.since}" if self.entry.since else ""
            return (f"{what}: the server's configuration entry changed since it was pinned{since}: "
                    f"{summary(list(self.entry.changes))}; everything the server offers is withheld until a person "
                    f"reviews it with `bastion pins diff {self.reference}` and trusts it with `{self.accept}`")
        review = (f"a person can review it with `bastion pins diff {self.reference}` and trust it with "
                  f"`bastion pins accept {self.reference}`")
        if self.verdict.status == RENAMED:
            further = list(self.verdict.changes[1:])
            return (f"{what}: {self.verdict.why}, so it is treated as a changed definition (a new name does not "
                    f"dodge a pin){f', and besides: {summary(further)}' if further else ''}; {review}")
        since = f" on {self.verdict.since}" if self.verdict.since else ""
        return (f"{what}: its definition changed since it was pinned{since}: {summary(list(self.verdict.changes))}; "
                f"{review}")

    def data(self) -> dict[str, Any]:
        changes = self.entry if self.entry is not None else self.verdict
        return {"guardrail": "pinning", "server": self.server, SINGULAR[self.kind].split()[-1]: self.key,
                "status": self.intervention_kind,
                "changes": [c.summary for c in changes.changes] if changes is not None else [],
                "review": f"bastion pins diff {self.reference}", "accept": self.accept}


@dataclass(frozen=True, slots=True)
class _Offered:
    exposed: str
    server: str
    kind: str
    key: str
    definition: Mapping[str, Any]


class PinningGuard:
    """Slot 1 of the guardrails: it sees a request first, so nothing inside it lists or calls a withheld one."""

    methods = frozenset({"tools/list", "prompts/list", "resources/templates/list", "tools/call", "prompts/get",
                         "resources/read"})
    reads_params = False  # of a tools/call it reads only the name, which it decodes itself when left as bytes
    # Of the methods above it reads only the lists' results, which the gateway builds as objects and never passes
    # as a server's bytes; a tools/call's result it never reads, so declaring it keeps that result raw.
    reads_results = False

    def __init__(self, config: GuardrailsConfig, report: InterventionLog, store: PinStore | StatePins,
                 catalog: CatalogView | None = None, *, watch_seconds: float = WATCH_SECONDS,
                 entries: Mapping[str, Mapping[str, Any]] | None = None,
                 identities: Mapping[str, str] | None = None) -> None:
        """``catalog``, when given, is judged again when the pins file changes while something is withheld, and the
        clients that were served a list without it are told the list changed. ``entries``: each server's
        configuration entry in its pinned form (bastion/server_entry.py), pinned beside its definitions.
        ``identities``: the identity each server name is pinned under (pin_book.server_id); a server not in it is
        pinned under its name."""
        self._entries = dict(entries or {})
        self._ids = dict(identities or {})
        self._catalog = catalog
        self._watch_seconds = watch_seconds
        self._watcher: asyncio.Task[None] | None = None
        self._listeners: weakref.WeakSet[Any] = weakref.WeakSet()  # clients served a list with something left out
        self._config = config
        self._report = report
        self._store = store
        self._book = PinBook()
        self._signature: Signature = None
        self._loaded = False
        self._problem: str | None = None  # why the pins file cannot be read, while it cannot
        self._unwritable: str | None = None  # said once: pins are kept for this run only
        self._unreachable: str | None = None  # said once per outage: the shared store's pins cannot be read
        self._lock = asyncio.Lock()
        self._tools_from: Sequence[Any] | None = None  # the catalog's tool sequence last judged
        self._tools_book: PinBook | None = None  # the book it was judged against
        self._withheld_tools: dict[str, Withheld] = {}
        self._others_from: int | None = None  # the catalog version whose prompts and templates were last judged
        self._others_book: PinBook | None = None
        self._withheld_prompts: dict[str, Withheld] = {}  # by exposed name
        self._withheld_templates: dict[str, Withheld] = {}  # by uriTemplate
        self._reported: set[tuple[str, str, str, str]] = set()
        self._unwritten: list[Observation] = []  # recorded in memory, on their way to the pins file
        self._writer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------------ the chain
    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        method = request.method
        if method == "tools/call":
            name = _call_name(request.params)
            if not self.passes_call(request.catalog, name):
                await self.check_call(request, name)
            return await call_next(request)
        # A list waits until what it pinned is in the pins file (a one-shot `bastion tools` exits right after); a call
        # never waits for the disk.
        if method == "tools/list":
            result = await call_next(request)
            withheld = await self._tool_withholdings(request.catalog, reread=True)
            await self._flushed()
            return self._served(request, result, "tools", withheld, "name")
        if method == "prompts/list":
            result = await call_next(request)
            prompts, _ = await self._other_withholdings(request.catalog, reread=True)
            await self._flushed()
            return self._served(request, result, "prompts", prompts, "name")
        if method == "resources/templates/list":
            result = await call_next(request)
            _, templates = await self._other_withholdings(request.catalog, reread=True)
            await self._flushed()
            return self._served(request, result, "resourceTemplates", templates, "uriTemplate")
        if method == "prompts/get":
            name = request.params.get("name")
            withheld = (await self._other_withholdings(request.catalog))[0].get(name)
            if withheld is not None and await self._reread():
                withheld = (await self._other_withholdings(request.catalog))[0].get(name)
            if withheld is not None:
                self._refuse(request, withheld)
        elif method == "resources/read":
            # A URI read through a withheld template is refused as the template is: the client need never have
            # listed the templates.
            template = _template_read(request.catalog, request.params)
            if template is not None:
                withheld = (await self._other_withholdings(request.catalog))[1].get(template)
                if withheld is not None and await self._reread():
                    withheld = (await self._other_withholdings(request.catalog))[1].get(template)
                if withheld is not None:
                    self._refuse(request, withheld)
        return await call_next(request)

    def passes_call(self, catalog: CatalogView, name: str | None) -> bool:
        """Whether a ``tools/call`` of ``name`` passes with nothing to wait for: every verdict on ``catalog`` is at
        hand and none withholds ``name`` (nearly every call: identity checks and one lookup). When it does not,
        ``check_call`` decides."""
        return (catalog.tools() is self._tools_from and self._tools_book is self._book
                and self._others_book is self._book and self._others_from is not None
                and getattr(catalog, "version", None) == self._others_from and name not in self._withheld_tools)

    async def check_call(self, request: GatewayRequest, name: str | None) -> None:
        """Refuse a ``tools/call`` of ``name`` whose tool is withheld (raises the refusal): judged again first when
        the catalog or the book changed, and the pins file read again when it is withheld (a person may have
        accepted it meanwhile)."""
        catalog = request.catalog
        entry = catalog.tool(name) if name is not None else None
        if entry is not None and self._enforced(entry.server):
            withheld = await self._withheld_tool(catalog, name)  # type: ignore[arg-type]
            if withheld is not None:
                self._refuse(request, withheld)

    def _enforced(self, server: str) -> bool:
        return self._config.switch("pinning", server) == "enforce"

    def _refuse(self, request: GatewayRequest, withheld: Withheld) -> None:
        self._report.report(Intervention(
            "pinning", "refused", withheld.server, f"{SINGULAR[withheld.kind]} {withheld.key}",
            withheld.intervention_kind, "trust-on-first-use", _detail(withheld),
            request.session.session_id, request.session.identity))
        raise GatewayError(INVALID_PARAMS, withheld.sentence(), withheld.data())

    def _served(self, request: GatewayRequest, result: dict[str, Any], key: str, withholdings: dict[str, Withheld],
                field: str) -> dict[str, Any]:
        """``result`` without the withheld items, which ``withholdings`` has by their ``field`` (a new list: the
        catalog's items are shared, never changed)."""
        page = result.get(key) if isinstance(result, dict) else None
        if not withholdings or not isinstance(page, list):
            if key == "tools":
                note_withheld_tools(request.session, "pinning", frozenset())
            return result
        kept: list[Any] = []
        left_out: list[Withheld] = []
        for item in page:
            withheld = withholdings.get(item.get(field)) if isinstance(item, dict) else None
            if withheld is None:
                kept.append(item)
            else:
                left_out.append(withheld)
        if key == "tools":  # a call_tool of one of them gets this guard's refusal, not "unknown tool"
            note_withheld_tools(request.session, "pinning", frozenset(w.exposed for w in left_out))
        if not left_out:
            return result
        _tell(request, left_out)
        self._listen(request.session.client)
        return {**result, key: kept}

    # ------------------------------------------------------------------------------------------ acceptance
    def _listen(self, client: Any) -> None:
        """Remember ``client`` to tell it when a person accepts what it was not served, and watch the pins file."""
        if client is None or self._catalog is None:
            return
        try:
            self._listeners.add(client)
        except TypeError:  # a channel that cannot be referred to weakly is not told
            return
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        """While something is withheld, read the pins file when it changes; what it now serves, the clients that
        were served lists without it hear of by the list's list_changed."""
        assert self._catalog is not None
        while self._withheld_tools or self._withheld_prompts or self._withheld_templates or self._problem is not None:
            await asyncio.sleep(self._watch_seconds)
            before = (set(self._withheld_tools), set(self._withheld_prompts), set(self._withheld_templates))
            if not await self._reread():
                continue
            tools = set(await self._tool_withholdings(self._catalog))
            prompts, templates = (set(w) for w in await self._other_withholdings(self._catalog))
            changed = [method for method, was, now in (
                ("notifications/tools/list_changed", before[0], tools),
                ("notifications/prompts/list_changed", before[1], prompts),
                ("notifications/resources/list_changed", before[2], templates)) if was != now]
            for client in list(self._listeners):
                for method in changed:
                    try:
                        client.list_changed(method)
                    except Exception as exc:  # a client gone meanwhile; the others are still told
                        log.debug("telling a client %s failed: %r", method, exc)

    # ------------------------------------------------------------------------------------------ tools
    async def _withheld_tool(self, catalog: CatalogView, name: str) -> Withheld | None:
        withheld = (await self._tool_withholdings(catalog)).get(name)
        if withheld is not None and await self._reread():  # a person may have accepted it meanwhile
            withheld = (await self._tool_withholdings(catalog)).get(name)
        return withheld

    async def _tool_withholdings(self, catalog: CatalogView, *, reread: bool = False) -> dict[str, Withheld]:
        """The catalog's withheld tools by exposed name, judged again only when the catalog or the book changed."""
        if reread and (self._withheld_tools or self._problem is not None):
            await self._reread()
        await self._other_withholdings(catalog)  # first seen together with the tools, not only when listed
        entries = catalog.tools()
        if entries is self._tools_from and self._tools_book is self._book:
            return self._withheld_tools
        async with self._lock:
            if entries is self._tools_from and self._tools_book is self._book:
                return self._withheld_tools
            await self._confirmed()
            offered = [_Offered(entry.exposed_name, entry.server, "tools", entry.original_name,
                                {**entry.definition, "name": entry.original_name})
                       for entry in entries if self._enforced(entry.server)]
            withheld = self._reconcile(offered)
            self._withheld_tools, self._tools_from, self._tools_book = withheld, entries, self._book
            return withheld

    # ------------------------------------------------------------------------------------------ prompts, templates
    async def _other_withholdings(self, catalog: CatalogView, *, reread: bool = False,
                                  ) -> tuple[dict[str, Withheld], dict[str, Withheld]]:
        """The catalog's withheld prompts (by exposed name) and templates (by uriTemplate), judged again only when
        the catalog or the book changed."""
        if reread and (self._withheld_prompts or self._withheld_templates or self._problem is not None):
            await self._reread()
        view: PinnedCatalog = catalog  # type: ignore[assignment]
        if getattr(view, "listing", None) is None:  # a catalog of tools only
            return {}, {}
        version = getattr(view, "version", None)
        if version is not None and version == self._others_from and self._others_book is self._book:
            return self._withheld_prompts, self._withheld_templates
        async with self._lock:
            if version is not None and version == self._others_from and self._others_book is self._book:
                return self._withheld_prompts, self._withheld_templates
            await self._confirmed()
            offered = [item for kind in ("prompts", "resourceTemplates")
                       for item in _listed(view, kind, view.listing(kind)) if self._enforced(item.server)]
            withheld = self._reconcile(offered)
            self._withheld_prompts = {name: w for name, w in withheld.items() if w.kind == "prompts"}
            self._withheld_templates = {name: w for name, w in withheld.items() if w.kind == "resourceTemplates"}
            self._others_from, self._others_book = version, self._book
            return self._withheld_prompts, self._withheld_templates

    # ------------------------------------------------------------------------------------------ judging
    def _reconcile(self, offered: list[_Offered]) -> dict[str, Withheld]:
        """Judge ``offered`` against the book, record what is new or newly changed (in memory at once, in the pins
        file soon after), and return what is withheld."""
        if self._problem is not None:
            withheld = {item.exposed: Withheld(item.exposed, item.server, item.kind, item.key, None, self._problem,
                                               configuration=self._configuration(item.server))
                        for item in offered}
            self._report_new(withheld.values())
            return withheld
        before = self._book
        held = self._held_entries(offered)
        self._book, seen, verdicts = reconcile(
            self._book, [(self._id(item.server), item.kind, item.key, item.definition) for item in offered], now(),
            frozenset(self._id(server) for server in held))
        if seen:
            # In the pins file soon after. Should another process have pinned another definition first, the file
            # says so once written, and the next judgement follows it.
            self._persist(seen)
            pinned = [o.server for o in seen if o.action == "pin"]
            for server in sorted(set(pinned)):
                log.info("pinned %d definitions of server %s on first use", pinned.count(server), _described(server))
        withheld = {item.exposed: Withheld(item.exposed, item.server, item.kind, item.key, verdict,
                                           configuration=self._configuration(item.server))
                    for item, verdict in zip(offered, verdicts) if verdict.withheld}
        if self._unreachable is not None:
            # Trusted on first use only once the store says it is the first use: another replica may have pinned
            # another definition under the name meanwhile. Nothing of this judgement is kept in memory, so the
            # next one (the catalog moved) finds them first seen again, and withholds them again.
            self._book = before
            first = {(o.server, o.kind, o.key) for o in seen if o.action == "pin"}
            withheld.update((item.exposed, Withheld(
                item.exposed, item.server, item.kind, item.key, None,
                f"it is offered for the first time, and whether another replica pinned it cannot be checked: "
                f"{self._unreachable}", configuration=self._configuration(item.server)))
                for item in offered if (self._id(item.server), item.kind, item.key) in first)
        self._report_new(withheld.values(), offered)
        for item in offered:  # a changed entry holds all its server offers, changed or not
            if item.server in held:
                withheld[item.exposed] = Withheld(item.exposed, item.server, item.kind, item.key,
                                                  held[item.server].verdict, entry=held[item.server].verdict,
                                                  configuration=self._configuration(item.server))
        return withheld

    def _held_entries(self, offered: list[_Offered]) -> dict[str, Withheld]:
        """Judge the configuration entries of the servers in ``offered`` (pinned the first time) and return those
        that changed since they were pinned, by server, each reported once."""
        entries = [_Offered(f"{server}/{ENTRY_KEY}", server, ENTRY_KIND, ENTRY_KEY, self._entries[server])
                   for server in sorted({item.server for item in offered}) if server in self._entries]
        if not entries:
            return {}
        self._book, seen, verdicts = reconcile(
            self._book, [(self._id(item.server), item.kind, item.key, item.definition) for item in entries], now())
        if seen:
            self._persist(seen)
        held = {item.server: Withheld(item.exposed, item.server, item.kind, item.key, verdict, entry=verdict,
                                      configuration=self._configuration(item.server))
                for item, verdict in zip(entries, verdicts) if verdict.withheld}
        self._report_new(held.values(), entries)
        return held

    def _id(self, server: str) -> str:
        return self._ids.get(server, server)

    def _configuration(self, server: str) -> str | None:
        return split_id(self._id(server))[0]

    def _persist(self, seen: list[Observation]) -> None:
        self._unwritten.extend(seen)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_unwritten())

    async def _flushed(self) -> None:
        """Wait until what was recorded so far is in the pins file (or could not be written)."""
        if self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)  # a cancelled list must not cancel the write of others' pins

    async def _write_unwritten(self) -> None:
        while self._unwritten:
            batch, self._unwritten = self._unwritten, []
            try:
                book, signature = await self._store.record_async(batch)
            except PinStoreError as exc:
                # Pinned in memory still: a change within this run is caught; a change across a restart is not.
                if self._unwritable != str(exc):
                    self._unwritable = str(exc)
                    log.error("%s; definitions are pinned for this run only", exc)
                continue
            # The file's book is every process's; what was recorded meanwhile is on its way.
            self._book = apply(book, self._unwritten, now()) if self._unwritten else book
            self._signature = signature

    def _report_new(self, withheld: Iterable[Withheld], offered: list[_Offered] = ()) -> None:
        definitions = {item.exposed: item.definition for item in offered}
        for item in withheld:
            mark = (item.server, item.kind, item.key, _digest(definitions.get(item.exposed)))
            if mark in self._reported:
                continue
            self._reported.add(mark)
            self._report.report(Intervention("pinning", "withheld", item.server, f"{SINGULAR[item.kind]} {item.key}",
                                             item.intervention_kind, "trust-on-first-use", _detail(item)))

    # ------------------------------------------------------------------------------------------ the pins file
    async def _ensure_loaded(self) -> None:
        if not self._loaded:
            await self._load()

    async def _reread(self) -> bool:
        """Read the pins file again if it changed since it was read; whether it did."""
        try:
            signature = await self._store.signature_async()
        except PinsUnreachable as exc:
            if self._keeps(exc):
                return False
            self._fail(str(exc))
            return True
        except PinStoreError as exc:
            self._fail(str(exc))
            return True
        if self._loaded and signature == self._signature and self._problem is None and self._unreachable is None:
            return False
        await self._load()
        return True

    async def _confirmed(self) -> None:
        """Before a judgement: the pins as they are now, when they are the replicas' shared ones (another replica
        may have pinned what this one sees first), else as read last."""
        if isinstance(self._store, StatePins):
            await self._reread()
        else:
            await self._ensure_loaded()

    def load_now(self) -> None:
        """Read the pins file on the calling thread: at start, before any request."""
        try:
            self._take(*self._store.load())
        except PinStoreError as exc:
            self._fail(str(exc))

    async def _load(self) -> None:
        try:
            book, signature = await self._store.load_async()
        except PinsUnreachable as exc:
            if not self._keeps(exc):
                self._fail(str(exc))
            return
        except PinStoreError as exc:
            self._fail(str(exc))
            return
        self._take(book, signature)

    def _take(self, book: PinBook, signature: Signature) -> None:
        if self._problem is not None:
            log.warning("%s can be read again; definitions are checked against them", self._store.path)
        self._book, self._signature, self._problem, self._loaded = book, signature, None, True
        self._unreachable = None

    def _keeps(self, exc: PinsUnreachable) -> bool:
        """Whether to go on judging against the pins read last while the shared store cannot be reached: when they
        were read (and could be), so an outage withholds nothing that was served and releases nothing withheld."""
        if not self._loaded or self._problem is not None:
            return False
        if self._unreachable != str(exc):
            self._unreachable = str(exc)
            log.warning("%s; definitions are judged against the pins read last until it answers", exc)
        return True

    def _fail(self, problem: str) -> None:
        if self._problem != problem:
            log.error("%s", problem)
        self._problem, self._loaded = problem, True
        self._book = PinBook()  # a new object: every cached judgement is made again


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView,
          entries: Mapping[str, Mapping[str, Any]] | None = None,
          identities: Mapping[str, str] | None = None, state: StateStore | None = None) -> PinningGuard | None:
    """The pinning interceptor, or None when pinning is off for every server. The pins file is read now, at start,
    so that a client's first call waits for no disk. ``entries``: each server's configuration entry, pinned too;
    ``identities``: the identity each server is pinned under (by name when absent). With a ``state`` store that
    replicas share, the pins are kept there (pin_state.py), read at the first request (the store is asynchronous),
    and pins kept by name alone are not carried over (a shared store has none of before identities)."""
    if not config.on_anywhere("pinning"):
        return None
    if state is not None and state.shared:
        return PinningGuard(config, report, StatePins(state), catalog, entries=entries, identities=identities)
    store = PinStore(config.pins_path())
    guard = PinningGuard(config, report, store, catalog, entries=entries, identities=identities)
    claim_pins(store, entries or {}, identities or {})
    guard.load_now()
    return guard


def claim_pins(store: PinStore, entries: Mapping[str, Mapping[str, Any]], identities: Mapping[str, str]) -> None:
    """At start, before anything is judged: each server that has no pins under its identity yet takes those of
    its name kept by name alone (a pins file from before identities) or under a configuration file that is gone (a
    moved file), when they pinned the same entry; said in the log, as is a namesake whose entry differs (it keeps
    its pins, and this server is trusted on first use)."""
    claims = {identities[name]: entry for name, entry in entries.items() if identities.get(name, name) != name}
    if not claims:
        return
    try:
        before, _ = store.load()
        known = set(before.servers())
        if known.issuperset(claims):  # every start but a server's first: nothing to carry over, no lock taken
            return
        moved = dict(store.claim(claims))
        book, _ = store.load()
    except PinStoreError as exc:  # said by the guard, which reads the file next (or writes it, for a lock)
        log.debug("pins not carried over: %s", exc)
        return
    for server in sorted(claims):
        if server in moved:
            source = moved[server]
            log.warning("the pins of server %s carry over from %s: its configuration entry is the one they pinned",
                        _described(server), _described(source) if split_id(source)[0] else
                        "the pins file of before pins were kept per configuration file (by name alone)")
        elif server not in known:
            for other in unclaimed(book, server, configuration_gone):
                owner = split_id(other)[0]
                log.warning("server %s is trusted on first use: the pins of %s have another configuration entry, so "
                            "they stay apart (`bastion pins forget %s --of %s` drops them)", _described(server),
                            _described(other), split_id(other)[1], owner or "-")


# ------------------------------------------------------------------------------------------ helpers
def _described(server: str) -> str:
    """A pinned identity in words: ``'fs' of /home/me/project/.cursor/mcp.json`` (a name alone: ``'fs'``)."""
    configuration, name = split_id(server)
    return f"{name!r}" + (f" of {configuration}" if configuration else "")


def _listed(catalog: CatalogView, kind: str, page: list[Any]) -> Iterable[_Offered]:
    """The prompts or templates of ``page`` with the server that offers each and its own definition."""
    view: PinnedCatalog = catalog  # type: ignore[assignment]
    for item in page:
        if not isinstance(item, dict):
            continue
        if kind == "prompts":
            named = view.prompt(item.get("name")) if isinstance(item.get("name"), str) else None
            if named is not None:
                yield _Offered(named.exposed, named.server, kind, named.original, {**item, "name": named.original})
        else:
            template = item.get("uriTemplate")
            server = view.template_owner(template) if isinstance(template, str) else None
            if server is not None:
                yield _Offered(template, server, kind, item_key(kind, item), item)


def _call_name(params: Mapping[str, Any]) -> str | None:
    name = params.get("name")
    if type(name) is msgspec.Raw:  # params the frontend left as the client's bytes
        try:
            name = msgspec.json.decode(name)
        except msgspec.DecodeError:
            return None
    return name if isinstance(name, str) else None


def _digest(definition: Mapping[str, Any] | None) -> str:
    if definition is None:
        return ""
    return hashlib.sha256(orjson.dumps(definition, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _detail(withheld: Withheld) -> str:
    if withheld.verdict is None:
        return "the pins file cannot be read"
    return summary(list(withheld.verdict.changes))


def _tell(request: GatewayRequest, withheld: list[Withheld]) -> None:
    """Say in words, once per session and definition, why a listed item is missing: a warning log message, when
    the request takes them (a 2026-07-28 one opts in by its log level; a handshake-era client gets them until it
    sets a level above warning)."""
    session: Session = request.session
    client = session.client
    threshold = request.log_level
    if client is None or threshold is None or _LOG_LEVELS.index("warning") < (
            _LOG_LEVELS.index(threshold) if threshold in _LOG_LEVELS else 0):
        return
    told: set[tuple[str, str]] = session.facts.setdefault(_TOLD, set())
    for item in withheld:
        mark = (item.exposed, item.sentence())
        if mark in told:
            continue
        told.add(mark)
        client.notify("notifications/message", {"level": "warning", "logger": "bastion.pinning",
                                                "data": {"message": item.sentence(), **item.data()}})


def _template_read(catalog: CatalogView, params: Any) -> str | None:
    """The uriTemplate a ``resources/read`` is answered through, None for a listed resource or an unknown URI."""
    uri = params.get("uri") if isinstance(params, dict) else None
    finder = getattr(catalog, "resource_definition", None)
    found = finder(uri) if finder is not None and isinstance(uri, str) else None
    if found is None or found[1] != "resourceTemplates":
        return None
    return found[2].get("uriTemplate")
