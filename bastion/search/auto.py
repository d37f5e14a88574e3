"""Exposure "auto": every tool while the catalog is small, search mode once listing it all costs too much.

Past 10 tools or 5,000 tokens of definitions, production guidance has models pick tools worse and pay for every
definition on every turn; below it, a search round trip buys nothing. The decision is made on the federated catalog
(what the gateway lists before policy filters it per caller) and made again whenever the catalog changes, so a
server that joins with hundreds of tools turns search mode on, and the gateway's list_changed tells the clients.

Nothing here imports the index: a small catalog never loads numpy, bm25s or a model runtime.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

import msgspec

from bastion.model import CatalogView, GatewayRequest, Handler, Interceptor
from bastion.search.canonical import canonical_tools_bytes

log = logging.getLogger("bastion.search")

# The threshold production guidance gives for switching to tool search.
MAX_LISTED_TOOLS = 10
MAX_LISTED_TOKENS = 5000
# The tokenizer the catalog is measured with (the one `bastion tools stats` leads with).
ENCODING = "o200k_base"


@dataclass(frozen=True)
class CatalogSize:
    tools: int
    # The definitions as one canonical JSON list (None: not measured, the tool count decided).
    bytes: int | None = None
    # Their tokens (None: not counted; a token is at least a byte, so a list within MAX_LISTED_TOKENS bytes is
    # within the bound without loading a tokenizer, which costs about a second).
    tokens: int | None = None

    @property
    def needs_search(self) -> bool:
        return self.tools > MAX_LISTED_TOOLS or (self.tokens is not None and self.tokens > MAX_LISTED_TOKENS)

    def describe(self) -> str:
        if self.tokens is not None:
            return f"{self.tools} tools, {self.tokens:,} {ENCODING} tokens of definitions"
        if self.bytes is not None:
            return f"{self.tools} tools, {self.bytes:,} bytes of definitions (so at most as many tokens)"
        return f"{self.tools} tools"


TokenCounter = Callable[[bytes], int]


def measure(definitions: Sequence[dict[str, Any]], count_tokens: Callable[[], TokenCounter]) -> CatalogSize:
    """How big the catalog is, measuring only what the decision needs: the tool count first, then the bytes,
    then (``count_tokens()`` gives the counter) the tokens."""
    size, blob = measure_without_tokens(definitions)
    return size if blob is None else CatalogSize(size.tools, size.bytes, count_tokens()(blob))


def measure_without_tokens(definitions: Sequence[dict[str, Any]]) -> tuple[CatalogSize, bytes | None]:
    """The size as far as the tool count and the bytes decide (microseconds: at most 10 tools are serialised), and
    the canonical list when only its tokens can decide."""
    if len(definitions) > MAX_LISTED_TOOLS:
        return CatalogSize(len(definitions)), None
    blob = canonical_tools_bytes(definitions)
    if len(blob) <= MAX_LISTED_TOKENS:
        return CatalogSize(len(definitions), len(blob)), None
    return CatalogSize(len(definitions), len(blob)), blob


def tiktoken_counter() -> TokenCounter:
    """o200k_base from the offline vocabulary `bastion tools stats` uses; loaded on the first count."""
    from bastion.search.economics import count_tokens
    from bastion.search.tokenizers_offline import EncodingLoader

    loader = EncodingLoader()
    return lambda blob: count_tokens(loader.get(ENCODING), blob)


def shown_to_clients(exposure: str, definitions: Sequence[dict[str, Any]]) -> str:
    """How clients are shown a catalog of ``definitions`` under ``exposure``, in a sentence for people."""
    meta = "search_tools and call_tool"
    if exposure != "auto":
        return f"clients are shown {'every tool' if exposure == 'all' else meta} (tools.exposure = {exposure!r})"
    size = measure(definitions, tiktoken_counter)
    bound = f"{MAX_LISTED_TOOLS} tools or {MAX_LISTED_TOKENS:,} tokens"
    if size.needs_search:
        return f"clients are shown {meta}: {size.describe()}, past {bound} (tools.exposure = 'auto')"
    return f"clients are shown every tool: {size.describe()}, within {bound} (tools.exposure = 'auto')"


class AutoExposure:
    """Search mode (``search``, a :class:`~bastion.search.exposure.SearchExposure`) while the catalog is past the
    threshold; the request passes untouched otherwise. The switch is logged with the counts, each time it flips."""

    span_name = "exposure"  # its span, when tracing is on

    # A tools/call's arguments and results are not read here (the search exposure decodes the meta-tools' own),
    # so a small catalog keeps the byte pass-through of calls.
    methods = frozenset({"tools/list", "tools/call"})
    reads_params = False
    reads_results = False

    def __init__(self, catalog: CatalogView, search: Callable[[], Interceptor],
                 count_tokens: TokenCounter | None = None,
                 starting: Callable[[], Sequence[tuple[str, str]]] = tuple) -> None:
        """``starting``: the servers that have not joined yet, with what each is doing; while there are any, the
        catalog's size is not known, and clients are shown search mode (``search_tools`` reaches every server as it
        joins, where a list of the few tools in so far would leave a client nothing to call the others with)."""
        self._catalog = catalog
        self._make_search = search
        self._starting = starting
        self._while_starting = False  # whether the last decision was made while servers were starting
        self._search: Interceptor | None = None
        self._count = count_tokens
        self._entries: Sequence[Any] | None = None
        self._size: CatalogSize | None = None
        self._searching: bool | None = None
        self._counting: asyncio.Future[None] | None = None  # the tokens of a catalog past the tool count, for the log

    def __call__(self, request: GatewayRequest, call_next: Handler) -> Awaitable[dict[str, Any]]:
        # A plain function: with the catalog unchanged and small, a call costs one identity check and no coroutine
        # of its own (every tools/call passes here).
        if ((self._catalog.tools() is self._entries and not self._searching and not self._while_starting
             and not _names_a_meta_tool(request)) or request.session.finds_tools_itself):
            return call_next(request)
        return self._decide_then_call(request, call_next)

    async def _decide_then_call(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        # A meta-tool is answered whatever the mode: a client that listed them in an earlier session (or before the
        # servers joined) still finds and calls tools through them, never "Unknown tool: search_tools".
        if await self._search_mode() or _names_a_meta_tool(request):
            if self._search is None:
                self._search = self._make_search()
            return await self._search(request, call_next)
        return await call_next(request)

    async def _search_mode(self) -> bool:
        entries = self._catalog.tools()
        starting = self._starting()
        if entries is not self._entries or bool(starting) != self._while_starting:  # else nothing changed
            # Measured on the spot, so a call is forwarded at once (a cancellation that follows it finds it at its
            # server); only a count of tokens goes to a thread: the first loads the tokenizer (about a second).
            size, blob = measure_without_tokens([entry.definition for entry in entries])
            if blob is not None:
                size = await self._with_tokens(size, blob)
            self._entries, self._size, self._while_starting = entries, size, bool(starting)
            if self._announce(size, starting) and size.needs_search and size.tokens is None:
                self._count_later([entry.definition for entry in entries])
        return bool(self._searching)

    async def _with_tokens(self, size: CatalogSize, blob: bytes) -> CatalogSize:
        """``size`` with its tokens counted; as it was when the vocabulary cannot be had (a missing or altered file:
        the catalog stays listed whole, as it was before search existed, and the log says which file)."""
        from bastion.search.tokenizers_offline import EncodingUnavailable

        try:
            tokens = await asyncio.to_thread(lambda: self._counter()(blob))
        except EncodingUnavailable as error:
            log.warning("tool exposure auto: could not count the definitions' tokens (%s); deciding by the tool "
                        "count alone", error)
            return size
        return CatalogSize(size.tools, size.bytes, tokens)

    def _count_later(self, definitions: list[dict[str, Any]]) -> None:
        """The tokens of a catalog that the tool count alone put in search mode, logged once counted: the switch
        is not held up for them (at 10,000 tools counting takes seconds of CPU)."""

        async def count() -> None:
            blob = canonical_tools_bytes(definitions)
            tokens = await asyncio.to_thread(lambda: self._counter()(blob))
            log.info("tool exposure auto: the %d tools' definitions are %s %s tokens, which search mode keeps out of "
                     "every turn", len(definitions), f"{tokens:,}", ENCODING)

        self._counting = asyncio.ensure_future(count())
        self._counting.add_done_callback(_report_count_failure)

    def _announce(self, size: CatalogSize, starting: Sequence[tuple[str, str]] = ()) -> bool:
        """Logs the decision when it flips (or is first made); whether it did."""
        searching = size.needs_search or bool(starting)
        if searching == self._searching:
            return False
        first = self._searching is None
        self._searching = searching
        bound = f"{MAX_LISTED_TOOLS} tools or {MAX_LISTED_TOKENS:,} tokens"
        if starting and not size.needs_search:
            log.info("tool exposure auto: %s so far, and servers still starting (%s): clients see search_tools and "
                     "call_tool until every server has joined", size.describe(),
                     ", ".join(f"{name}: {doing}" for name, doing in starting))
        elif searching:
            log.info("tool exposure auto: %s, past %s: clients see search_tools and call_tool%s", size.describe(),
                     bound, "" if first else " from now on")
        else:
            log.info("tool exposure auto: %s, within %s: clients see every tool%s", size.describe(), bound,
                     "" if first else " from now on")
        return True

    def _counter(self) -> TokenCounter:
        if self._count is None:
            self._count = tiktoken_counter()
        return self._count

    @property
    def size(self) -> CatalogSize | None:
        """The catalog as last measured (None before the first tools request)."""
        return self._size


def _report_count_failure(counting: asyncio.Future[None]) -> None:
    if not counting.cancelled() and (error := counting.exception()) is not None:
        log.warning("tool exposure auto: counting the catalog's tokens failed: %r", error)


_META_TOOLS = frozenset({"search_tools", "call_tool"})
_META_TOOLS_RAW = frozenset({b'"search_tools"', b'"call_tool"'})


def _names_a_meta_tool(request: GatewayRequest) -> bool:
    """Whether ``request`` calls ``search_tools`` or ``call_tool`` (a name left as the client's JSON bytes too)."""
    if request.method != "tools/call":
        return False
    name = request.params.get("name")
    if type(name) is str:
        return name in _META_TOOLS
    return isinstance(name, msgspec.Raw) and bytes(name) in _META_TOOLS_RAW
