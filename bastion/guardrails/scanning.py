"""Secret and personal-data scanning of everything that reaches the model, redacting in place or blocking.

``ContentScanner`` is the pure part: it runs every detector (``secrets``, ``pii``) over the strings
``content.text_slots`` finds, replaces each value it is told to redact by a marker naming its kind
(``[redacted: aws-access-key]``), and says what it found and where, never the value. ``ScanningInterceptor`` applies it
to results of ``tools/call``, ``resources/read`` and ``prompts/get``, to error messages, and to servers'
``sampling/createMessage`` requests, with what the configuration says for that server and kind; a result of more
than ``scanning.thread_above_bytes`` of text is scanned in a worker thread (Hyperscan lets go of the GIL), so the
event loop goes on serving others meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.content import TextSlot, error_slots, text_slots
from bastion.guardrails.raw import RawResults
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.model import CatalogView, GatewayError, GatewayRequest, Handler
from bastion.paths import cache_dir
from bastion.protocol.jsonrpc import RawResponse

if TYPE_CHECKING:  # the detectors and their libraries load in the background (see ScannerInBackground)
    from bastion.guardrails.matching import Detector, Finding, Matcher  # noqa: F401

SCANNED_RESULTS = frozenset({"tools/call", "resources/read", "prompts/get"})
SAMPLING = "sampling/createMessage"
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


class ContentScanner:
    """Finds and redacts credentials and personal data in the strings of a message."""

    def __init__(self, matcher: Matcher) -> None:
        self._matcher = matcher

    @property
    def detectors(self) -> tuple[Detector, ...]:
        return self._matcher.detectors

    def scan(self, slots: Iterable[TextSlot], action_of: Callable[[Detector], Action]) -> list[Hit]:
        """Every value found in ``slots``; those whose action is "redact" are replaced in place, the others are
        left as they are (a "block" is the caller's to carry out)."""
        hits: list[Hit] = []
        for slot in slots:
            text = slot.text
            if len(text) < _SHORTEST_VALUE:
                continue
            data = text.encode("utf-8", "surrogatepass")
            redactions: list[tuple[int, int, str]] = []
            for found in self._findings(data, slot.name):
                action = action_of(found.detector)
                if action == "off":
                    continue
                hits.append(Hit(found.detector.guardrail, found.detector.kind, found.detector.rule, slot.where, action))
                if action == "redact":
                    redactions.append((found.start, found.end, marker(found.detector.kind)))
            if redactions:
                slot.replace(_spliced(data, redactions))
        return hits

    def _findings(self, data: bytes, name: str | None) -> list[Finding]:
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

    def find_in(self, text: str) -> list[tuple[Detector, str]]:
        """What the detectors find in ``text``, each with the value (for dry runs and tests, never for reports)."""
        data = text.encode("utf-8", "surrogatepass")
        return [(found.detector, data[found.start:found.end].decode("utf-8", "replace"))
                for found in self._matcher.find(data)]


def _spliced(data: bytes, redactions: list[tuple[int, int, str]]) -> str:
    parts: list[bytes] = []
    position = 0
    for start, end, replacement in redactions:
        parts.append(data[position:start])
        parts.append(replacement.encode())
        position = end
    parts.append(data[position:])
    return b"".join(parts).decode("utf-8", "replace")


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
    return frozenset(detector.kind for detector in all_detectors())


class ScannerInBackground:
    """The scanner, built in a thread from the gateway's start: reading the rules and loading the libraries takes
    most of a second (several the first time, when the automaton is compiled), which must not delay serving lists
    and calls. The first answer that needs scanning waits for it; if it cannot be built, every answer that needs it
    is refused with the reason rather than passed unscanned."""

    def __init__(self, make: Callable[[], ContentScanner] = default_scanner) -> None:
        self._done = threading.Event()
        self._scanner: ContentScanner | None = None
        self._failure: BaseException | None = None
        threading.Thread(target=self._build, args=(make,), name="bastion-scanner", daemon=True).start()

    def _build(self, make: Callable[[], ContentScanner]) -> None:
        try:
            self._scanner = make()
        except BaseException as exc:  # reported to every request that needs the scanner
            self._failure = exc
        finally:
            self._done.set()

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

    def on_anywhere(self) -> bool:
        settings = self._config.scanning
        return (self._config.on_anywhere("secrets") or self._config.on_anywhere("pii")
                or any(value != "off" for value in settings.kinds.values())
                or any(value != "off" for kinds in settings.servers.values() for value in kinds.values()))


class ScanningInterceptor:
    methods = SCANNED_RESULTS | {SAMPLING}
    # Of a client's call only the tool's name is read (decoded here when it is still the client's bytes), so the
    # arguments may stay as they came; a server's sampling request is always decoded, and its params are read. A
    # call's result may come as the server's bytes: decoded here (once for the chain), and passed on as those bytes
    # when nothing is found in it (bastion.guardrails.raw).
    reads_params = False
    reads_results = "raw"

    def __init__(self, scanner: ScannerInBackground, policy: ScanningPolicy, report: InterventionLog,
                 thread_above: int) -> None:
        self._scanner = scanner
        self._policy = policy
        self._report = report
        self._thread_above = thread_above
        self.raw_results = RawResults()  # the chain gives every guardrail that reads raw results the same one

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        if request.method == SAMPLING:
            await self._scan_sampling(request)
            return await call_next(request)
        server = _server_of(request)
        target = _target_of(request)
        try:
            result = await call_next(request)
        except GatewayError as error:
            raise await self._scanned_error(error, request, server, target) from None
        if type(result) is RawResponse:
            decoded = self.raw_results.decode(result)
            if not await self._scan_result(decoded, request, server, target):
                return self.raw_results.unchanged(result)
            self.raw_results.changed(result)
            return decoded
        if isinstance(result, dict):
            await self._scan_result(result, request, server, target)
        return result

    async def _scan_result(self, result: dict[str, Any], request: GatewayRequest, server: str | None,
                           target: str) -> bool:
        """Scan ``result`` and redact or block in place; whether anything was found (and so changed)."""
        hits = await self._scan(list(text_slots(request.method, result)), server)
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

    async def _scanned_error(self, error: GatewayError, request: GatewayRequest, server: str | None,
                             target: str) -> GatewayError:
        shape = error.to_error()
        hits = await self._scan(list(error_slots(shape)), server)
        if not hits:
            return error
        self._report_all(hits, request, server, target)
        blocked = [hit for hit in hits if hit.action == "block"]
        if blocked:
            return GatewayError(error.code, _blocked_words(blocked, server))
        return GatewayError(shape["code"], shape["message"], shape.get("data"))

    async def _scan_sampling(self, request: GatewayRequest) -> None:
        hits = await self._scan(list(text_slots(SAMPLING, request.params)), request.server)
        if not hits:
            return
        self._report_all(hits, request, request.server, SAMPLING)
        blocked = [hit for hit in hits if hit.action == "block"]
        if blocked:
            raise GatewayError(BLOCKED, "Bastion refused this sampling request: " + _blocked_words(blocked, None),
                               {"blocked": sorted({hit.kind for hit in blocked})})

    async def _scan(self, slots: list[TextSlot], server: str | None) -> list[Hit]:
        if not slots:
            return []
        action = self._policy.action_for(server)
        scanner = await self._scanner.get()
        size = sum(len(slot.text) for slot in slots)
        if size > self._thread_above:
            return await asyncio.to_thread(scanner.scan, slots, action)
        return scanner.scan(slots, action)

    def _report_all(self, hits: list[Hit], request: GatewayRequest, server: str | None, target: str) -> None:
        for (guardrail, kind, rule, action), wheres in _grouped(hits):
            self._report.report(Intervention(
                guardrail=guardrail, action="redacted" if action == "redact" else "blocked", server=server,
                target=target, kind=kind, rule=rule,
                detail=_count_and_places(wheres),
                session=request.session.session_id, identity=request.session.identity))


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
    if request.method == "resources/read":
        owner = getattr(catalog, "resource_owner", None)
        return owner(params["uri"]) if owner is not None and isinstance(params.get("uri"), str) else None
    return None


def _target_of(request: GatewayRequest) -> str:
    key = "uri" if request.method == "resources/read" else "name"
    name = request.params.get(key)
    if isinstance(name, msgspec.Raw):
        name = msgspec.json.decode(name)
    return f"{request.method} {name}" if isinstance(name, str) else request.method


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView) -> ScanningInterceptor | None:
    policy = ScanningPolicy(config)
    if not policy.on_anywhere():
        return None
    return ScanningInterceptor(ScannerInBackground(), policy, report, config.scanning.thread_above_bytes)
