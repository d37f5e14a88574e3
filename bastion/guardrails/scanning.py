"""Secret and personal-data scanning of everything that reaches the model, redacting in place or blocking.

``ContentScanner`` is the pure part: it runs every detector (``secrets``, ``pii``) over the strings
``content.text_slots`` finds, replaces each value it is told to redact by a marker naming its kind
(``[redacted: aws-access-key]``), and says what it found and where, never the value. ``ScanningInterceptor`` applies it
to every string (keys, ``_meta``, annotations, decoded payloads included) of results of ``tools/call``,
``resources/read``, ``prompts/get`` and ``completion/complete``, to servers' errors for them, to every definition of
the four lists, to servers' progress and log notifications, and to their ``sampling/createMessage`` and
``elicitation/create`` requests, with what the configuration says for that server and kind; a message of more than
``scanning.thread_above_bytes`` of text is scanned in a worker thread (Hyperscan lets go of the GIL), so the event
loop goes on serving others meanwhile. ``redact_instructions`` is the same scan of a server's ``instructions``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.content import INSTRUCTED, UNSCANNABLE, TextSlot, copy_tree, error_slots, text_slots
from bastion.guardrails.echo import EchoCheck
from bastion.guardrails.raw import RawResults
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import CatalogView, GatewayError, GatewayRequest, Handler
from bastion.paths import cache_dir
from bastion.protocol.jsonrpc import RawResponse

if TYPE_CHECKING:  # the detectors and their libraries load in the background (see ScannerInBackground)
    from bastion.guardrails.matching import Detector, Finding, Matcher  # noqa: F401

SCANNED_RESULTS = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete"})
SAMPLING = "sampling/createMessage"
ELICITATION = "elicitation/create"
TOWARD_CLIENT = frozenset({SAMPLING, ELICITATION})
NOTIFICATIONS = frozenset({"notifications/progress", "notifications/message"})
# Methods whose answer holds no server text but whose error does: a server's refusal of a subscription.
SUBSCRIPTIONS = frozenset({"resources/subscribe", "resources/unsubscribe"})
# List method -> the key of its items.
LISTS = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources",
         "resources/templates/list": "resourceTemplates"}
# No secret or personal value the detectors know is shorter (an e-mail address such as a@b.cd).
_SHORTEST_VALUE = 6
# JSON-RPC code of a blocked resource, prompt or sampling request (the range the gateway's own refusals use).
BLOCKED = -32003

Action = str  # "redact", "block" or "off"


def marker(kind: str) -> str:
    return f"[redacted: {kind}]"


@dataclass(frozen=True, slots=True)
class Hit:
    """One value found: what kind, by which rule, where in the message, and what was done (never the value)."""

    guardrail: str
    kind: str
    rule: str
    where: str
    action: Action


# What a scanner reports for a part of a message its walk's bounds left unread (``content.UnscannableSlot``): it is
# withheld when the kind's action is "redact", refused when "block", like any value found.
UNSCANNABLE_KIND = "unscannable"

# Invisible characters that may be planted inside a value to break it up for a pattern: zero-width space, non-joiner
# and joiner, word joiner and the invisible operators, byte-order mark, soft hyphen, Mongolian vowel separator,
# combining grapheme joiner. As UTF-8, so the scanner strips them from the bytes it reads.
@dataclass(frozen=True, slots=True)
class _Bounds:
    """Stands for a detector where a part of a message was left unread (the kind's setting, else ``secrets``')."""

    guardrail: str = "secrets"
    kind: str = UNSCANNABLE_KIND
    rule: str = "bastion:scanning-bounds"


_UNSCANNABLE_DETECTOR = _Bounds()
_INVISIBLE = re.compile(rb"\xe2\x80[\x8b-\x8d]|\xe2\x81[\xa0-\xa4]|\xef\xbb\xbf|\xc2\xad|\xe1\xa0\x8e|\xcd\x8f")


class ContentScanner:
    """Finds and redacts credentials and personal data in the strings of a message."""

    def __init__(self, matcher: Matcher) -> None:
        self._matcher = matcher

    @property
    def detectors(self) -> tuple[Detector, ...]:
        return self._matcher.detectors

    def scan(self, slots: Iterable[TextSlot], action_of: Callable[[Detector], Action],
             call: Mapping[str, Any] | None = None) -> list[Hit]:
        """Every value found in ``slots``; those whose action is "redact" are replaced in place, the others are
        left as they are (a "block" is the caller's to carry out). Each string is read alone, without the invisible
        characters planted in it; the texts of consecutive text blocks are read joined too, and a value found across
        a boundary is redacted part by part. An unscannable slot counts as a value of kind ``unscannable``. ``call``:
        the params of the ``tools/call`` answered, whose own personal data echoed back is no hit
        (``bastion.guardrails.echo``)."""
        slots = list(slots)
        echo = EchoCheck(call) if call is not None else None
        hits: list[Hit] = []
        plans: dict[int, list[tuple[int, int, str]]] = {}
        datas: list[bytes] = []
        for index, slot in enumerate(slots):
            if slot.unscannable:
                datas.append(b"")
                action = action_of(_UNSCANNABLE_DETECTOR)  # type: ignore[arg-type]
                if action != "off":
                    hits.append(Hit("secrets", UNSCANNABLE_KIND, _UNSCANNABLE_DETECTOR.rule, slot.where, action))
                    if action == "redact":
                        plans[index] = []
                continue
            data = slot.data
            datas.append(data)
            if len(data) < _SHORTEST_VALUE:
                continue
            for found in self._findings(data, slot.name):
                action = action_of(found.detector)
                if action == "off" or echo is not None and found.detector.guardrail == "pii" and echo.supplied(
                        data[found.start:found.end]):
                    continue
                hits.append(Hit(found.detector.guardrail, found.detector.kind, found.detector.rule, slot.where, action))
                if action == "redact":
                    plans.setdefault(index, []).append((found.start, found.end, marker(found.detector.kind)))
        for run in _runs(slots):
            self._scan_joined(run, slots, datas, plans, hits, action_of, echo)
        for index, redactions in plans.items():
            slot = slots[index]
            if slot.unscannable:
                slot.replace(UNSCANNABLE)
            elif redactions:
                slot.replace_data(_spliced(datas[index], redactions))
        return hits

    def _scan_joined(self, run: list[int], slots: list[TextSlot], datas: list[bytes],
                     plans: dict[int, list[tuple[int, int, str]]], hits: list[Hit],
                     action_of: Callable[[Detector], Action],
                     echo: EchoCheck | None = None) -> None:
        """Read the texts of ``run`` (consecutive text blocks) as one; a value that spans a boundary is found here
        only, and each block's part of it is redacted."""
        starts: list[int] = []
        position = 0
        for index in run:
            starts.append(position)
            position += len(datas[index])
        joined = b"".join(datas[index] for index in run)
        if len(joined) < _SHORTEST_VALUE:
            return
        for found in self._findings(joined, None):
            first = bisect.bisect_right(starts, found.start) - 1
            last = bisect.bisect_right(starts, found.end - 1) - 1
            if first == last:
                continue  # inside one block: read there already
            parts = []
            for at in range(first, last + 1):
                index = run[at]
                start = max(found.start - starts[at], 0)
                end = min(found.end - starts[at], len(datas[index]))
                if end > start:
                    parts.append((index, start, end))
            if any(_overlaps(plans.get(index, ()), start, end) for index, start, end in parts):
                continue
            action = action_of(found.detector)
            if action == "off" or echo is not None and found.detector.guardrail == "pii" and echo.supplied(
                    joined[found.start:found.end]):
                continue
            where = " + ".join(slots[index].where for index, _, _ in parts)
            hits.append(Hit(found.detector.guardrail, found.detector.kind, found.detector.rule, where, action))
            if action == "redact":
                for index, start, end in parts:
                    plans.setdefault(index, []).append((start, end, marker(found.detector.kind)))

    def _findings(self, data: bytes, name: str | None) -> list[Finding]:
        """What is found in ``data`` read without its invisible characters (the places are ``data``'s own)."""
        if _INVISIBLE.search(data) is None:
            return self._found(data, name)
        visible, places = _without_invisible(data)
        from bastion.guardrails.matching import Finding

        return [Finding(found.detector, places[found.start], places[found.end - 1] + 1)
                for found in self._found(visible, name)]

    def _found(self, data: bytes, name: str | None) -> list[Finding]:
        """What is found in ``data``; a string filed under a name in structured data is read as it would be written
        in a configuration file, ``name: "value"``, so the rules that look for a key-like name beside a value (the
        generic one) see it; only what is found inside the value counts."""
        if not name:
            return self._matcher.find(data)
        from bastion.guardrails.matching import Finding

        prefix = f'{name}: "'.encode("utf-8", "surrogatepass")
        shift = len(prefix)
        return [Finding(found.detector, found.start - shift, found.end - shift)
                for found in self._matcher.find(prefix + data + b'"')
                if found.start >= shift and found.end <= shift + len(data)]

    def finds_any(self, data: bytes) -> bool:
        """Whether any detector finds a value in ``data`` (the UTF-8 of one string of protocol text, such as a text
        block's), read as ``scan`` reads such a string: the pre-scan's question (``bastion.guardrails.prescan``)."""
        return len(data) >= _SHORTEST_VALUE and bool(self._findings(data, None))

    def find_in(self, text: str) -> list[tuple[Detector, str]]:
        """What the detectors find in ``text``, each with the value (for dry runs and tests, never for reports)."""
        data = text.encode("utf-8", "surrogatepass")
        return [(found.detector, data[found.start:found.end].decode("utf-8", "replace"))
                for found in self._findings(data, None)]


def _without_invisible(data: bytes) -> tuple[bytes, list[int]]:
    """``data`` without its invisible characters, and for each byte kept its place in ``data``."""
    kept: list[bytes] = []
    places: list[int] = []
    position = 0
    for match in _INVISIBLE.finditer(data):
        kept.append(data[position:match.start()])
        places.extend(range(position, match.start()))
        position = match.end()
    kept.append(data[position:])
    places.extend(range(position, len(data)))
    return b"".join(kept), places


def _runs(slots: list[TextSlot]) -> Iterator[list[int]]:
    """The indexes of slots that are texts of consecutive text blocks of one list, two or more of them."""
    run: list[int] = []
    previous: tuple[int, int] | None = None
    for index, slot in enumerate(slots):
        here = slot.run
        if here is None:
            continue
        if previous is not None and here[0] == previous[0] and here[1] == previous[1] + 1:
            run.append(index)
        else:
            if len(run) > 1:
                yield run
            run = [index]
        previous = here
    if len(run) > 1:
        yield run


def _overlaps(redactions: Iterable[tuple[int, int, str]], start: int, end: int) -> bool:
    return any(start < their_end and their_start < end for their_start, their_end, _ in redactions)


def _spliced(data: bytes, redactions: list[tuple[int, int, str]]) -> bytes:
    parts: list[bytes] = []
    position = 0
    for start, end, replacement in sorted(redactions):
        if start < position:  # overlapping another redaction: covered by it, up to its end
            start = position
            if end <= start:
                continue
            replacement = ""
        parts.append(data[position:start])
        parts.append(replacement.encode())
        position = end
    parts.append(data[position:])
    return b"".join(parts)


def slots_size(slots: list[TextSlot]) -> int:
    """The characters of ``slots``' strings, which decide whether a scan goes to a worker thread."""
    return sum(len(slot.text) for slot in slots)


def all_detectors() -> tuple[Detector, ...]:
    from bastion.guardrails.pii import PII_DETECTORS
    from bastion.guardrails.secrets import secret_detectors

    return secret_detectors() + PII_DETECTORS


_BUILDING = threading.Lock()


@functools.cache
def _built_scanner() -> ContentScanner:
    from bastion.guardrails.matching import Matcher

    return ContentScanner(Matcher(all_detectors(), cache=cache_dir() / "guardrails"))


def default_scanner() -> ContentScanner:
    """The scanner with every detector; built once per process (the compiled automaton is cached on disk too)."""
    with _BUILDING:  # two threads asking at once build it once
        return _built_scanner()


def known_kinds() -> frozenset[str]:
    """Every kind a scanner can report, the names ``[guardrails.scanning]`` accepts."""
    return frozenset(detector.kind for detector in all_detectors()) | {UNSCANNABLE_KIND}


def redact_instructions(text: str, config: GuardrailsConfig | None = None, server: str | None = None,
                        scanner: ContentScanner | None = None) -> tuple[str, list[Hit]]:
    """A server's ``instructions`` (its initialize result) with every secret and personal value redacted as the
    configuration says for ``server``, and what was found (never the value). A kind set to block withholds the whole
    text (``""``). Pure: it reports nothing; the caller reports the hits."""
    if not isinstance(text, str) or not text:
        return text, []
    policy = ScanningPolicy(config or GuardrailsConfig())
    holder = {"instructions": text}
    hits = (scanner or default_scanner()).scan(text_slots("initialize", holder), policy.action_for(server))
    if any(hit.action == "block" for hit in hits):
        return "", hits
    return holder["instructions"], hits


class ScannerInBackground:
    """The scanner, built in a thread from the gateway's start: reading the rules and loading the libraries takes
    most of a second (several the first time, when the automaton is compiled), which must not delay serving lists
    and calls. The first answer that needs scanning waits for it; if it cannot be built, every answer that needs it
    is refused with the reason rather than passed unscanned."""

    def __init__(self, make: Callable[[], ContentScanner] = default_scanner) -> None:
        self._done = threading.Event()
        self._scanner: ContentScanner | None = None
        self._failure: BaseException | None = None
        # Not a daemon: the interpreter waits for it at exit. A daemon thread still compiling the native automaton
        # when a short command ends (`bastion guard check` refusing before it scans) aborted the process (exit
        # 134, "terminate called without an active exception").
        threading.Thread(target=self._build, args=(make,), name="bastion-scanner", daemon=False).start()

    def _build(self, make: Callable[[], ContentScanner]) -> None:
        try:
            self._scanner = make()
        except BaseException as exc:  # reported to every request that needs the scanner
            self._failure = exc
        finally:
            self._done.set()

    def ready(self) -> ContentScanner | None:
        """The scanner when it is built, without waiting; None while it is being built or when it failed."""
        return self._scanner

    async def get(self) -> ContentScanner:
        if not self._done.is_set():
            await asyncio.to_thread(self._done.wait)
        if self._scanner is None:
            raise GatewayError(-32603, f"Bastion cannot scan this answer for secrets and personal data: the scanner "
                               f"failed to start ({self._failure}); the answer is withheld")
        return self._scanner


class ScanningPolicy:
    """What to do with a kind found in content from a server: the kind's own setting for that server, then the
    kind's setting everywhere, then the guardrail's switch (``secrets`` or ``pii``) for that server."""

    def __init__(self, config: GuardrailsConfig) -> None:
        self._config = config
        # Each server's decider, made once: a running chain's configuration does not change.
        self._actions: dict[str | None, Callable[[Detector], Action]] = {}

    def action_for(self, server: str | None) -> Callable[[Detector], Action]:
        action = self._actions.get(server)
        if action is None:
            action = self._actions[server] = self._action_for(server)
        return action

    def _action_for(self, server: str | None) -> Callable[[Detector], Action]:
        settings = self._config.scanning
        own = settings.servers.get(server, {}) if server is not None else {}
        switches = {name: self._config.switch(name, server) for name in ("secrets", "pii")}

        def action(detector: Detector) -> Action:
            return own.get(detector.kind) or settings.kinds.get(detector.kind) or switches[detector.guardrail]

        return action

    def on_for(self, server: str | None) -> bool:
        """Whether any kind found in ``server``'s content may be acted on (else every action is "off")."""
        settings = self._config.scanning
        own = settings.servers.get(server, {}) if server is not None else {}
        return (any(self._config.switch(name, server) != "off" for name in ("secrets", "pii"))
                or any(value != "off" for value in settings.kinds.values())
                or any(value != "off" for value in own.values()))

    def on_anywhere(self) -> bool:
        settings = self._config.scanning
        return (self._config.on_anywhere("secrets") or self._config.on_anywhere("pii")
                or any(value != "off" for value in settings.kinds.values())
                or any(value != "off" for kinds in settings.servers.values() for value in kinds.values()))


class ScanningInterceptor:
    methods = SCANNED_RESULTS | frozenset(LISTS) | NOTIFICATIONS | TOWARD_CLIENT | INSTRUCTED | SUBSCRIPTIONS
    # Of a client's call only the tool's name is read (decoded here when it is still the client's bytes), so the
    # arguments may stay as they came; a server's request or notification is always decoded, and its params are read.
    # A call's result may come as the server's bytes: decoded here (once for the chain), and passed on as those bytes
    # when nothing is found in it (bastion.guardrails.raw).
    reads_params = False
    reads_results = "raw"

    def __init__(self, scanner: ScannerInBackground, policy: ScanningPolicy, report: InterventionLog,
                 thread_above: int, catalog: CatalogView | None = None) -> None:
        self._scanner = scanner
        self._policy = policy
        self._report = report
        self._thread_above = thread_above
        self._catalog = catalog
        self.raw_results = RawResults()  # the chain gives every guardrail that reads raw results the same one
        # Definitions as the lists serve them (the catalog's own objects): id -> (the definition, what to serve
        # instead: itself when clean, a redacted copy, or None when withheld), so a list passing again costs a lookup.
        self._definitions: dict[int, tuple[Any, Any]] = {}

    def scans_for(self, server: str | None) -> bool:
        """Whether anything found in ``server``'s content would be redacted or blocked."""
        return self._policy.on_for(server)

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> Any:
        method = request.method
        if method in TOWARD_CLIENT:
            await self._scan_toward_client(request)
            return await call_next(request)
        if method in NOTIFICATIONS:
            await self._scan_notification(request)
            return await call_next(request)
        if method in LISTS:
            return await self._scan_list(request, await call_next(request))
        if method in INSTRUCTED:
            return await self._scan_instructions(request, await call_next(request))
        server = _server_of(request)
        target = _target_of(request)
        try:
            result = await call_next(request)
        except GatewayError as error:
            raise await self.scanned_error(error, request, server, target) from None
        if type(result) is RawResponse:
            decoded = self.raw_results.decode(result)
            if not await self.scan_result(decoded, request, server, target):
                return self.raw_results.unchanged(result)
            self.raw_results.changed(result)
            return decoded
        if isinstance(result, dict):
            await self.scan_result(result, request, server, target)
        return result

    async def scan_result(self, result: dict[str, Any], request: GatewayRequest, server: str | None,
                           target: str, slots: list[TextSlot] | None = None, size: int | None = None) -> bool:
        """Scan ``result`` and redact or block in place; whether anything was found (and so changed). ``slots``
        (and their ``size``): its strings, when the caller walked it already."""
        if slots is None:
            slots = list(text_slots(request.method, result))
        # A call's own arguments are read only if personal data is found (bastion.guardrails.echo).
        hits = await self._scan(slots, server, size, request.params if request.method == "tools/call" else None)
        if not hits:
            return False
        self._report_all(hits, request, server, target)
        blocked = [hit for hit in hits if hit.action == "block"]
        if not blocked:
            return True
        words = _blocked_words(blocked, server)
        if request.method == "tools/call":
            result.clear()
            result.update({"content": [{"type": "text", "text": words}], "isError": True})
            return True
        raise GatewayError(BLOCKED, words, {"blocked": sorted({hit.kind for hit in blocked})})

    async def _scan_instructions(self, request: GatewayRequest, result: Any) -> Any:
        """The servers' joined instructions in Bastion's answer to ``initialize`` or ``server/discover``, redacted as
        the gateway-wide settings say (they are one text by then); withheld whole when a kind found blocks."""
        text = result.get("instructions") if isinstance(result, dict) else None
        if not isinstance(text, str) or not text:
            return result
        holder = {"instructions": text}
        hits = await self._scan(list(text_slots("initialize", holder)), None)
        if not hits:
            return result
        self._report_all(hits, request, None, "instructions")
        answer = {**result, "instructions": holder["instructions"]}
        if any(hit.action == "block" for hit in hits) or not isinstance(holder["instructions"], str):
            del answer["instructions"]
        return answer

    async def scanned_error(self, error: GatewayError, request: GatewayRequest, server: str | None,
                             target: str) -> GatewayError:
        shape = error.to_error()
        hits = await self._scan(list(error_slots(shape)), server)
        if not hits:
            return error
        self._report_all(hits, request, server, target)
        blocked = [hit for hit in hits if hit.action == "block"]
        if blocked:
            return GatewayError(error.code, _blocked_words(blocked, server))
        if not isinstance(shape.get("message"), str):  # withheld whole (beyond the bounds): still an error message
            shape["message"] = UNSCANNABLE
        return GatewayError(shape["code"], shape["message"], shape.get("data"))

    async def _scan_toward_client(self, request: GatewayRequest) -> None:
        """A server's sampling or elicitation request: redacted in place, or refused."""
        blocked = await self._scan_params(request)
        if blocked:
            what = "sampling" if request.method == SAMPLING else "elicitation"
            raise GatewayError(BLOCKED, f"Bastion refused this {what} request: " + _blocked_words(blocked, None),
                               {"blocked": sorted({hit.kind for hit in blocked})})

    async def _scan_notification(self, request: GatewayRequest) -> None:
        """A server's progress or log notification: redacted in place, or dropped (the refusal raised here is the
        gateway's reason not to forward it)."""
        blocked = await self._scan_params(request)
        if blocked:
            raise GatewayError(BLOCKED, f"{request.method} dropped: " + _blocked_words(blocked, request.server))

    async def _scan_params(self, request: GatewayRequest) -> list[Hit]:
        """A server's message toward a client, redacted in place and reported; the hits that block it."""
        if not isinstance(request.params, dict):
            return []
        hits = await self._scan(list(text_slots(request.method, request.params)), request.server)
        if not hits:
            return []
        self._report_all(hits, request, request.server, request.method)
        return [hit for hit in hits if hit.action == "block"]

    async def _scan_list(self, request: GatewayRequest, result: Any) -> Any:
        """Every field of every definition of a list: a definition with a value found is served as a redacted copy
        (the catalog's own stays as it is), or withheld from the list when the value's kind is set to block."""
        key = LISTS.get(request.method)
        items = result.get(key) if isinstance(result, dict) and key is not None else None
        if not isinstance(items, list):
            return result
        served = [await self._definition(request, key, item) for item in items]
        if all(new is old for new, old in zip(served, items)):
            return result
        return {**result, key: [item for item in served if item is not None]}

    async def _definition(self, request: GatewayRequest, kind: str, item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        known = self._definitions.get(id(item))
        if known is not None and known[0] is item:
            return known[1]
        server = _definition_server(kind, item, self._catalog if self._catalog is not None else request.catalog)
        copy = copy_tree(item)
        hits = await self._scan(list(text_slots(request.method, copy)), server)
        served: Any = item
        if hits:
            name = str(item.get("name") or item.get("uri") or item.get("uriTemplate") or "?")
            self._report_all(hits, request, server, f"{request.method} {name}")
            served = None if any(hit.action == "block" for hit in hits) else copy
        if len(self._definitions) >= _DEFINITIONS_KEPT:
            self._definitions.clear()
        self._definitions[id(item)] = (item, served)
        return served

    async def _scan(self, slots: list[TextSlot], server: str | None, size: int | None = None,
                    call: Mapping[str, Any] | None = None) -> list[Hit]:
        if not slots:
            return []
        action = self._policy.action_for(server)
        scanner = await self._scanner.get()
        if size is None:
            size = slots_size(slots)
        if size > self._thread_above:
            return await asyncio.to_thread(scanner.scan, slots, action, call)
        return scanner.scan(slots, action, call)

    def _report_all(self, hits: list[Hit], request: GatewayRequest, server: str | None, target: str) -> None:
        for (guardrail, kind, rule, action), wheres in _grouped(hits):
            self._report.report(Intervention(
                guardrail=guardrail, action="redacted" if action == "redact" else "blocked", server=server,
                target=target, kind=kind, rule=rule,
                detail=_count_and_places(wheres),
                session=request.session.session_id, identity=request.session.identity))


_DEFINITIONS_KEPT = 16384


def _definition_server(kind: str, item: dict[str, Any], catalog: Any) -> str | None:
    """The server whose definition ``item`` is (its settings apply), from the catalog; None when not known."""
    name = item.get("name")
    try:
        if kind == "tools":
            entry = catalog.tool(name) if isinstance(name, str) else None
            return entry.server if entry is not None else None
        if kind == "prompts":
            lookup = getattr(catalog, "prompt", None)
            named = lookup(name) if lookup is not None and isinstance(name, str) else None
            return getattr(named, "server", None)
        owner = getattr(catalog, "resource_owner" if kind == "resources" else "template_owner", None)
        key = item.get("uri" if kind == "resources" else "uriTemplate")
        return owner(key) if owner is not None and isinstance(key, str) else None
    except Exception:  # a catalog that cannot say: the gateway-wide settings apply
        return None


def _grouped(hits: list[Hit]) -> Iterator[tuple[tuple[str, str, str, str], list[str]]]:
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for hit in hits:
        groups.setdefault((hit.guardrail, hit.kind, hit.rule, hit.action), []).append(hit.where)
    return iter(groups.items())


def _count_and_places(wheres: list[str]) -> str:
    places = list(dict.fromkeys(wheres))
    shown = ", ".join(places[:5]) + (f" and {len(places) - 5} more places" if len(places) > 5 else "")
    return f"{len(wheres)} value{'s' if len(wheres) > 1 else ''} in {shown}"


def _blocked_words(blocked: list[Hit], server: str | None) -> str:
    kinds = ", ".join(sorted({hit.kind for hit in blocked}))
    source = f"server '{server}'" if server else "the server"
    return (f"Bastion withheld this content from {source}: it contains {kinds}, which the guardrails are set to "
            f"block. Ask the user to change [guardrails] for this server if it is expected.")


def _server_of(request: GatewayRequest) -> str | None:
    """The server a client request goes to, so its per-server settings apply (None: the gateway-wide ones)."""
    params = request.params
    catalog: Any = request.catalog
    if request.method == "tools/call":
        name = params.get("name")
        if isinstance(name, msgspec.Raw):
            name = msgspec.json.decode(name)
        entry = catalog.tool(name) if isinstance(name, str) else None
        return entry.server if entry is not None else None
    if request.method == "prompts/get":
        lookup = getattr(catalog, "prompt", None)
        named = lookup(params.get("name")) if lookup is not None and isinstance(params.get("name"), str) else None
        return getattr(named, "server", None)
    if request.method == "resources/read" or request.method in SUBSCRIPTIONS:
        owner = getattr(catalog, "resource_owner", None)
        return owner(params["uri"]) if owner is not None and isinstance(params.get("uri"), str) else None
    if request.method == "completion/complete":
        ref = params.get("ref") if isinstance(params, dict) else None
        if isinstance(ref, dict) and ref.get("type") == "ref/prompt":
            return _definition_server("prompts", ref, catalog)
        if isinstance(ref, dict) and ref.get("type") == "ref/resource":
            return _definition_server("resourceTemplates", {"uriTemplate": ref.get("uri")}, catalog)
    return None


def _target_of(request: GatewayRequest) -> str:
    key = "uri" if request.method == "resources/read" or request.method in SUBSCRIPTIONS else "name"
    params = request.params
    if request.method == "completion/complete":
        ref = params.get("ref") if isinstance(params, dict) else None
        params = ref if isinstance(ref, dict) else {}
        key = "uri" if params.get("type") == "ref/resource" else "name"
    name = params.get(key)
    if isinstance(name, msgspec.Raw):
        name = msgspec.json.decode(name)
    return f"{request.method} {name}" if isinstance(name, str) else request.method


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView) -> ScanningInterceptor | None:
    policy = ScanningPolicy(config)
    if not policy.on_anywhere():
        return None
    return ScanningInterceptor(ScannerInBackground(), policy, report, config.scanning.thread_above_bytes, catalog)
