"""Cross-server taint: once a session has read content that may steer the model, a call that changes something on
*another* server waits for a person (or is refused).

Content taints a session when it comes from where anyone may have written it — a server the catalog says is open
world, reaches the network or was marked ``trust = "untrusted"`` by the user (``content_origin``), or a tool that
says ``openWorldHint: true`` — or when the injection scan flagged it (``guardrails.injection_flags``). A local server
without network (time, git, filesystem) taints nothing by its answers alone, whatever its trust. The session
keeps the first such content of each server (``session.facts[TAINTED_BY]``), which Cedar sees as
``context.session.tainted_by`` and every approval prompt names. A later ``tools/call`` of a tool that is not
read-only (as the policy counts it: ``read_only``) on a server other than those sources needs a person's approval:
the policy's, when it just asked one with the taint named; none for a tool the client's file approves in advance,
unless the scan flagged what tainted the session; else this guardrail's own question in the client, or in the
approval queue when the client cannot be asked (a refusal saying why when there is no queue).

A 2026-07-28 client has no session: each of its requests is a session of its own. So that what one request read
still holds the next request's calls, its taint is kept per caller (``TaintMemory``: bounded, each source expiring
``cross_server.taint_memory_seconds`` after the last answer of its server that tainted the caller), and
``TaintRecall``, before the policy, gives each of the caller's requests what its earlier ones left.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import msgspec

from bastion.clients.known_tools import claims_open_world
from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.injection import INJECTION_FLAGS
from bastion.guardrails.remembered import caller_key, unreachable
from bastion.guardrails.report import Intervention, InterventionLog
from bastion.guardrails.sampling import server_trust
from bastion.model import (TAINTED_BY, TO_SERVER, CatalogView, GatewayError, GatewayRequest, Handler, Identity,
                           Session, TaintSource, ToolEntry)
from bastion.state import MemoryStore, StateStore, StateUnavailable

log = logging.getLogger("bastion.guardrails")

TAINT_REFUSED = -32001  # the policy's refusal code: a tainted session's call is refused the way a policy refuses
# What taints a 2026-07-28 request whose caller's earlier requests cannot be recalled (the store is unreachable): no
# server is named so (a name in brackets and with a space is no configured server's), so every call that changes
# something is held as after another server's content.
UNKNOWN_STATE = "(shared state)"
_ANNOTATIONS_TRUSTED_AT = frozenset({"trusted", "reviewed"})
_ANSWERING = {"tools/call": "name", "resources/read": "uri", "prompts/get": "name"}


def named(params: Mapping[str, Any], key: str) -> str | None:
    """``params[key]`` as a string, also when the params are still the client's JSON values (``msgspec.Raw``: a
    chain that reads no call's arguments leaves them so)."""
    value = params.get(key)
    if type(value) is msgspec.Raw:
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError:
            return None
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------------------------------ pure decisions
def tainting(server: str, origin: str | None, flags: Mapping[str, str], target: str,
             open_world_tool: bool = False) -> TaintSource | None:
    """Whether an answer of ``server`` taints the session: the injection scan flagged it, the server's content comes
    from where anyone may write it (``origin``: why, or None), or the tool that answered says ``openWorldHint``."""
    flagged = flags.get(server)
    if flagged:
        return TaintSource(server, target, f"flagged by the injection scan: {flagged}")
    if origin is not None:
        return TaintSource(server, target, origin)
    if open_world_tool:
        return TaintSource(server, target, "its tool says it reaches the open world (openWorldHint)")
    return None


def content_origin(catalog: CatalogView, server: str) -> str | None:
    """Why everything ``server`` answers may steer the model, as the catalog knows it (open world, network, the
    user's mark); a view that does not know says so of an untrusted server, as before it could tell."""
    declared = getattr(catalog, "server_taints", None)
    if callable(declared):
        origin = declared(server)
        return origin if isinstance(origin, str) else None
    return "untrusted server" if server_trust(catalog, server) == "untrusted" else None


def read_only(entry: ToolEntry) -> bool:
    """A tool that changes nothing, as the policy counts it: Bastion knows it reads only (``entry.reads_only``), or
    it says ``readOnlyHint: true`` and its server's annotations are believed."""
    if entry.reads_only:
        return True
    annotations = entry.definition.get("annotations")
    return (entry.server_trust in _ANNOTATIONS_TRUSTED_AT and isinstance(annotations, Mapping)
            and annotations.get("readOnlyHint") is True)


def held_by(entry: ToolEntry, tainted: Mapping[str, TaintSource]) -> list[TaintSource]:
    """The sources that make a call of ``entry`` need approval: content of other servers, when the tool is not
    read-only; empty when the call may run."""
    if read_only(entry):
        return []
    return [source for server, source in tainted.items() if server != entry.server]


def taint_sources(session: Session) -> dict[str, TaintSource]:
    return session.facts.get(TAINTED_BY) or {}


def record(session: Session, source: TaintSource) -> bool:
    """Keep ``source`` unless its server tainted the session already (the first content is what prompts name);
    returns whether it is new. A new dict each time, so a reader holding the old one sees it unchanged."""
    known = taint_sources(session)
    if source.server in known:
        return False
    session.facts[TAINTED_BY] = {**known, source.server: source}
    return True


def explain(sources: list[TaintSource]) -> str:
    return "; ".join(source.describe() for source in sources)


def question(entry: ToolEntry, sources: list[TaintSource]) -> str:
    return (f"This session has read content that could steer the model: {explain(sources)}. Allow the tool "
            f"'{entry.original_name}' on server '{entry.server}', which is not read-only, to run now?")


def elicitation(message: str, with_mode: bool) -> dict[str, Any]:
    params: dict[str, Any] = {
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {"approve": {"type": "boolean", "title": "Approve this call", "default": False}},
            "required": ["approve"],
        },
    }
    if with_mode:
        params["mode"] = "form"
    return params


def approves(answer: Any) -> bool:
    content = answer.get("content") if isinstance(answer, Mapping) and answer.get("action") == "accept" else None
    return isinstance(content, Mapping) and content.get("approve") is True


def answering_server(request: GatewayRequest) -> str | None:
    """The server whose answer a ``tools/call``, ``resources/read`` or ``prompts/get`` brings (None: unknown)."""
    return _server_named(request.catalog, request.method, named(request.params, _ANSWERING[request.method]))


def _server_named(catalog: CatalogView, method: str, name: str | None) -> str | None:
    if name is None:
        return None
    if method == "tools/call":
        entry = catalog.tool(name)
        return entry.server if entry is not None else None
    if method == "prompts/get":
        finder = getattr(catalog, "prompt", None)
        found = finder(name) if callable(finder) else None
        return getattr(found, "server", None)
    owner = getattr(catalog, "resource_owner", None)
    return owner(name) if callable(owner) else None


@dataclass(frozen=True, slots=True)
class Recalled:
    """What a caller's earlier requests left: the sources, in the order they came, and until when each holds."""

    sources: dict[str, TaintSource]
    until: dict[str, float]


NOTHING_RECALLED = Recalled({}, {})


class TaintMemory:
    """What tainted each caller's 2026-07-28 requests, kept between them in the gateway's store (so every replica
    sharing it recalls it): per identity, the first source of each server, which expires ``seconds`` after the last
    answer of that server that tainted the caller (renewed at most every ``renew_every`` seconds, so that a caller
    reading one server again and again costs a write a minute, not one per call). A caller's map holds at most one
    source per server and expires with its last source, so the memory stays bounded by the servers and the callers
    of the last ``seconds``.

    Each source is two fields of the caller's map: ``s:SERVER`` (the source, written once: the first content is
    what prompts name) and ``u:SERVER`` (until when, by ``clock``, rewritten when the server's answers renew it),
    so that renewing a source rewrites only its time."""

    def __init__(self, store: StateStore, seconds: float, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._seconds = seconds
        self._renew_every = min(60.0, seconds / 60)
        self._clock = clock

    async def recall(self, identity: Identity) -> dict[str, TaintSource]:
        """The sources still tainting ``identity``, in the order they came (empty when none); raises
        ``StateUnavailable`` when the store cannot be asked."""
        return (await self.recall_kept(identity)).sources

    async def recall_kept(self, identity: Identity) -> Recalled:
        """``recall`` with until when each source holds."""
        kept = await self._store.map_all(caller_key("taint", identity))
        if not kept:
            return NOTHING_RECALLED
        now = self._clock()
        live: list[tuple[float, TaintSource, float]] = []
        for field, packed in kept.items():
            if not field.startswith("s:"):
                continue
            until = _number(kept.get("u:" + field[2:]))
            source = _unpacked_source(packed)
            if source is not None and until is not None and until > now and source[1].server == field[2:]:
                live.append((*source, until))
        live.sort(key=lambda each: each[0])
        return Recalled({source.server: source for _, source, _ in live},
                        {source.server: until for _, source, until in live})

    async def keep(self, identity: Identity, sources: Mapping[str, TaintSource], renewed: str | None,
                   recalled: Recalled = NOTHING_RECALLED) -> bool:
        """Remember ``sources`` for ``identity``: each not ``recalled`` (new) from now, and ``renewed`` (the server
        that answered the request just done, when it taints) from now again, unless it was renewed within
        ``renew_every``; the others keep their time. Writes only when there is something to write (most requests):
        whether it wrote."""
        now = self._clock()
        until = str(now + self._seconds).encode()
        fields: dict[str, bytes] = {}
        for server, source in sources.items():
            if server not in recalled.sources:
                fields["s:" + server] = msgspec.json.encode([now, source.server, source.target, source.reason])
                fields["u:" + server] = until
            elif server == renewed and recalled.until[server] <= now + self._seconds - self._renew_every:
                fields["u:" + server] = until
        if not fields:
            return False
        await self._store.map_put(caller_key("taint", identity), fields, self._seconds)
        return True


def _number(packed: bytes | None) -> float | None:
    try:
        return float(packed) if packed is not None else None
    except ValueError:
        return None


def _unpacked_source(packed: bytes) -> tuple[float, TaintSource] | None:
    """A source as ``keep`` wrote it, with when it came; None for anything else (a store holds what it is given)."""
    try:
        since, server, target, reason = msgspec.json.decode(packed)
    except (msgspec.DecodeError, ValueError, TypeError):
        return None
    if not (isinstance(since, (int, float)) and all(isinstance(each, str) for each in (server, target, reason))):
        return None
    return float(since), TaintSource(server, target, reason)


# ------------------------------------------------------------------------------------------ values that flow
# A distinctive value: a run of the characters tokens, keys, ids and URLs are written in, at least MIN_VALUE_LENGTH
# long, with letters and digits both, and at least MIN_VALUE_ENTROPY bits per character. Words, numbers, paths and
# URLs without a digit, and anything shorter, never count: they are common, and two servers saying them is no flow.
MIN_VALUE_LENGTH = 12
MIN_VALUE_ENTROPY = 3.0
_TOKEN_CHAR = rb"[A-Za-z0-9_\-./+=:@%~]"
# A whole run of token characters, 12 or more long, holding a digit and a letter: found by the expression alone, so
# that text without one (most answers, most arguments) costs a single pass and no Python per word.
VALUE_RUN = re.compile(
    rb"(?<!%(c)s)(?=%(c)s{%(n)d})(?=%(c)s*?[0-9])(?=%(c)s*?[A-Za-z])%(c)s+"
    % {b"c": _TOKEN_CHAR, b"n": MIN_VALUE_LENGTH})


def distinctive(token: bytes) -> bool:
    """A run ``VALUE_RUN`` found is distinctive when its characters are varied enough to be no word or count."""
    length = len(token)
    entropy = -sum(n / length * math.log2(n / length) for n in Counter(token).values())
    return entropy >= MIN_VALUE_ENTROPY


# Runs of one message judged at most: each costs a few microseconds on the event loop, and an answer of megabytes of
# ids must not hold it for seconds. Values past them are not remembered or checked (docs/guardrails.md).
MAX_RUNS_PER_MESSAGE = 1024


def distinctive_values(json_text: bytes) -> list[bytes]:
    """The distinctive values in a JSON text (a result's, or a call's arguments): the same bytes for the same value
    in either, since both are read as JSON text with non-ASCII written as itself (``normalized_json``)."""
    runs = VALUE_RUN.findall(json_text)
    if len(runs) > MAX_RUNS_PER_MESSAGE:
        runs = runs[:MAX_RUNS_PER_MESSAGE]
    return [token for token in runs if distinctive(token)]


# The hashing key of ValueMemory, shared through the store: a log whose first entry wins, so that replicas starting
# together agree on one key however their appends interleave. A log is appended to only when it is found empty, and
# lives far longer than any value it hashes is remembered.
VALUE_KEY_LOG = "guardrails:flow-hash-key"
VALUE_KEY_BYTES = 32
_VALUE_KEY_SECONDS = 10 * 365 * 86400.0


class ValueMemory:
    """Which server's answers carried each distinctive value a caller was given, kept in the gateway's store (so
    every replica sharing it knows): per identity, a map from keyed hashes of the values (the key made once per store
    and shared through it, so the memory holds no value and a hash is no oracle to anyone without the store) to the
    servers that gave them and until when (``seconds`` after the value was last seen). Bounded: ``per_caller`` values
    per identity (the oldest forgotten first); a caller's map expires ``seconds`` after its last answer."""

    def __init__(self, store: StateStore, seconds: float, per_caller: int = 4096,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._seconds = seconds
        self._per_caller = per_caller
        self._clock = clock
        self._key: bytes | None = None

    async def _hash_key(self) -> bytes:
        if self._key is None:
            _, entries = await self._store.read_after(VALUE_KEY_LOG, 0)
            if not entries:
                await self._store.append(VALUE_KEY_LOG, os.urandom(VALUE_KEY_BYTES), keep=64,
                                         seconds=_VALUE_KEY_SECONDS)
                _, entries = await self._store.read_after(VALUE_KEY_LOG, 0)
            key = entries[0][1] if entries else b""
            if len(key) != VALUE_KEY_BYTES:
                raise StateUnavailable(f"the flow guard's hashing key in the store ({VALUE_KEY_LOG}) is not "
                                       f"{VALUE_KEY_BYTES} bytes")
            self._key = key
        return self._key

    async def _digests(self, values: list[bytes]) -> list[str]:
        key = await self._hash_key()
        return [hashlib.blake2b(value, digest_size=16, key=key).hexdigest() for value in values]

    async def note(self, identity: Identity, server: str, values: list[bytes]) -> None:
        """Remember that ``server``'s answer gave ``identity`` these ``values``; raises ``StateUnavailable`` when
        the store cannot be asked."""
        if not values:
            return
        digests = await self._digests(values)
        where = caller_key("values", identity)
        now = self._clock()
        kept = await self._store.map_all(where)
        until = now + self._seconds
        changed: dict[str, bytes] = {}
        for digest in dict.fromkeys(digests):
            # Only the values of this answer are read: a caller may have thousands kept, and most answers add few.
            known = _unpacked_value(kept.get(digest))
            servers = sorted({server, *known[0]}) if known is not None and known[1] > now else [server]
            changed[digest] = msgspec.json.encode([servers, until])
        dropped = self._past_the_bound(kept, changed, now)
        await self._store.map_put(where, {d: p for d, p in changed.items() if d not in dropped}, self._seconds)
        if dropped:
            await self._store.map_delete(where, sorted(dropped))

    def _past_the_bound(self, kept: Mapping[str, bytes], changed: Mapping[str, bytes], now: float) -> set[str]:
        """What to drop so that at most ``per_caller`` values stay: expired ones, then the least recently seen, down to
        seven eighths of the bound, so that a caller at the bound has its whole map read once every so many new
        values rather than with each answer."""
        if len(kept) + sum(1 for digest in changed if digest not in kept) <= self._per_caller:
            return set()
        seen = {digest: entry[1] if (entry := _unpacked_value(packed)) is not None else 0.0
                for digest, packed in {**kept, **changed}.items()}
        dropped = {digest for digest, when in seen.items() if when <= now}
        live = sorted((digest for digest in seen if digest not in dropped), key=seen.__getitem__)
        keep = self._per_caller - self._per_caller // 8
        return dropped | set(live[:max(0, len(live) - keep)])

    async def sources(self, identity: Identity, values: list[bytes], server: str) -> dict[str, int]:
        """The servers other than ``server`` whose answers gave ``identity`` any of ``values`` (and how many of
        them), when ``server``'s own answers did not give that value too; raises ``StateUnavailable`` when the
        store cannot be asked."""
        if not values:
            return {}
        kept = await self._store.map_all(caller_key("values", identity))
        if not kept:
            return {}
        now = self._clock()
        found: dict[str, int] = {}
        for digest in await self._digests(values):
            known = _unpacked_value(kept.get(digest))
            if known is None or known[1] <= now or server in known[0]:
                continue
            for source in known[0]:
                found[source] = found.get(source, 0) + 1
        return found


def _unpacked_value(packed: bytes | None) -> tuple[list[str], float] | None:
    if packed is None:
        return None
    try:
        servers, until = msgspec.json.decode(packed)
    except (msgspec.DecodeError, ValueError, TypeError):
        return None
    if not (isinstance(until, (int, float)) and isinstance(servers, list)
            and all(isinstance(each, str) for each in servers)):
        return None
    return servers, float(until)


# Asks a person outside the client: the approval queue, settled with `bastion approve` from another terminal (the
# policy's, handed in by the composition root). None when they approved, else why not.
OutOfBand = Callable[[GatewayRequest, ToolEntry, str], Awaitable["str | None"]]
NOBODY_IN_CLIENT = "no person could be asked (the client does not take elicitation requests in this session)"


async def ask_person(config: GuardrailsConfig, session: Session, message: str) -> str | None:
    """Ask the person in the client; None when they approved, else why not."""
    client = session.client
    if session.era == "modern" or client is None or not client.supports("elicitation"):
        return NOBODY_IN_CLIENT
    timeout = config.cross_server.approval_timeout_seconds
    params = elicitation(message, session.protocol_version >= "2025-11-25")
    try:
        answer = await asyncio.wait_for(client.request("elicitation/create", params), timeout)
    except asyncio.TimeoutError:
        return f"nobody answered within {timeout:g} s"
    except GatewayError as error:
        return f"the client could not ask ({error.message})"
    return None if approves(answer) else "the person declined"


# Whether a session's client may be asked to approve a call at all: the policy's ``approval.approver``, handed in by the
# composition root. Over HTTP the client is most often an agent, which would approve its own call.
ClientApproves = Callable[[Session], bool]


def stdio_client_approves(session: Session) -> bool:
    """Without a policy, as its default ``approver = "auto"``: only a client on stdio, where a person sits at it."""
    return not session.over_network


async def ask_someone(config: GuardrailsConfig, request: GatewayRequest, entry: ToolEntry, message: str,
                      out_of_band: OutOfBand | None, client_approves: ClientApproves | None = None) -> str | None:
    """Ask the person in the client when the approver setting lets the client be asked, else (or when the client
    cannot be asked: no elicitation, which many clients lack) in the approval queue rather than refusing; None when
    a person approved, else why not."""
    if (client_approves or stdio_client_approves)(request.session):
        problem = await ask_person(config, request.session, message)
    else:
        problem = NOBODY_IN_CLIENT
    if problem != NOBODY_IN_CLIENT or out_of_band is None:
        return problem
    return await out_of_band(request, entry, message)


def flagged_among(session: Session, sources: list[TaintSource]) -> list[str]:
    """The servers among ``sources`` whose content in this session the injection scan flagged."""
    flags = session.facts.get(INJECTION_FLAGS) or {}
    return [source.server for source in sources if flags.get(source.server)]


# ------------------------------------------------------------------------------------------ the interceptors
class TaintRecall:
    """Before the policy: a 2026-07-28 request starts with the taint its caller's earlier requests left (the policy,
    Cedar's ``context.session.tainted_by`` and ``TaintGuard`` read it from the session as for any session), and what
    it leaves is kept for the caller's next requests. A handshake-era session keeps its own taint and passes.

    Fails closed: when the store cannot be asked what the caller's earlier requests left, the request is judged as
    tainted by ``UNKNOWN_STATE`` (a call that changes something waits for a person, or is refused); when what it
    read cannot be recorded, its answer is withheld (the next request would not know of it)."""

    directions = frozenset({TO_SERVER})  # a client's requests: what answers them may taint
    reads_params = False  # only the name or URI of what answers, which ``named`` reads from the client's JSON too
    reads_results = False

    def __init__(self, memory: TaintMemory, report: InterventionLog | None = None) -> None:
        self._memory = memory
        self._report = report

    def on_request(self, request: GatewayRequest, call_next: Handler) -> Awaitable[Any]:
        # A plain function: a handshake-era session's request (nearly every one over stdio) costs no coroutine here.
        if request.session.era != "modern":
            return call_next(request)
        return self._recalled(request, call_next)

    async def _recalled(self, request: GatewayRequest, call_next: Handler) -> Any:
        session = request.session
        try:
            recalled = await self._memory.recall_kept(session.identity)
            earlier = recalled.sources
        except StateUnavailable as error:
            why = unreachable(error)
            log.warning("taint: %s; caller %r is judged as tainted until it can be", why, session.identity.name)
            recalled = NOTHING_RECALLED
            earlier = {UNKNOWN_STATE: TaintSource(UNKNOWN_STATE, "(its earlier requests)",
                                                  f"what they read is unknown: {why}")}
        if earlier:
            session.facts[TAINTED_BY] = {**earlier, **taint_sources(session)}
        try:
            result = await call_next(request)
        except GatewayError as error:  # a server's error message reaches the model as its result does
            await self._keep(request, recalled, error)
            raise
        await self._keep(request, recalled, None)
        return result

    async def _keep(self, request: GatewayRequest, recalled: Recalled, failed: BaseException | None) -> None:
        """Record what the request left; withhold its answer (raise) when that cannot be recorded."""
        session = request.session
        after = {server: source for server, source in taint_sources(session).items() if server != UNKNOWN_STATE}
        if not after:
            return
        renewed = answering_server(request) if request.method in _ANSWERING else None
        try:
            await self._memory.keep(session.identity, after, renewed, recalled)
        except StateUnavailable as error:
            why = unreachable(error)
            log.warning("taint: %s; the answer that tainted caller %r is withheld", why, session.identity.name)
            if self._report is not None:
                self._report.report(Intervention("taint", "refused", renewed, request.method, "state-unavailable",
                                                 "taint-state", why, session.session_id, session.identity))
            raise GatewayError(TAINT_REFUSED, f"The answer was withheld: it may steer the model "
                               f"({explain(list(after.values()))}), and {why} to remember that for this caller's "
                               "next requests; try again when it is back",
                               {"guardrail": "taint", "rule": "state-unavailable"}) from failed


class TaintGuard:
    """Records which content tainted a session, and holds a tainted session's calls that change another server."""

    methods = frozenset(_ANSWERING)
    reads_params = False  # only the name or URI, which ``named`` reads from the client's JSON too
    reads_results = False  # an answer taints by who sent it, not by what it says

    def __init__(self, config: GuardrailsConfig, report: InterventionLog) -> None:
        self._config = config
        self._report = report
        self.out_of_band: OutOfBand | None = None  # the approval queue, when the policy has one
        self.client_approves: ClientApproves | None = None  # the policy's approver setting, when there is a policy
        # Each server's switch, read once: the configuration does not change under a running chain, and a call asks
        # for two or three of them.
        self._modes: dict[str, str] = {}

    def _mode(self, server: str) -> str:
        mode = self._modes.get(server)
        if mode is None:
            mode = self._modes[server] = self._config.switch("taint", server)
        return mode

    async def __call__(self, request: GatewayRequest, call_next: Handler) -> dict[str, Any]:
        method = request.method
        key = _ANSWERING.get(method)
        if key is None:
            return await call_next(request)
        name = named(request.params, key)
        server = _server_named(request.catalog, method, name)
        if method == "tools/call" and server is not None:
            await self._hold_if_tainted(request, name)
        try:
            result = await call_next(request)
        except GatewayError:
            # A server's error message reaches the model as well as its result does.
            self.note_answer(request, server)
            raise
        if not (isinstance(result, dict) and result.get("resultType") == "input_required"):
            self.note_answer(request, server)
        return result

    def note_answer(self, request: GatewayRequest, server: str | None) -> None:
        """Record that ``server``'s answer to ``request`` reached the session, when it taints."""
        if server is None or self._mode(server) == "off":
            return
        if server in taint_sources(request.session):
            return  # the session keeps the first content of each server: nothing to record (nearly every call)
        flags = request.session.facts.get(INJECTION_FLAGS) or {}
        name = named(request.params, _ANSWERING[request.method])
        target = f"{request.method} {name}"
        entry = request.catalog.tool(name or "") if request.method == "tools/call" else None
        open_world = entry is not None and claims_open_world(entry.definition)
        source = tainting(server, content_origin(request.catalog, server), flags, target, open_world)
        # Not an intervention yet (nothing was held): what the session read is named when a call is held.
        if source is not None and record(request.session, source):
            log.debug("session %s is tainted by %s", request.session.session_id or "-", source.describe())

    async def _hold_if_tainted(self, request: GatewayRequest, name: str | None) -> None:
        entry = request.catalog.tool(name or "")
        if entry is not None:
            await self.hold_if_tainted(request, entry)

    async def hold_if_tainted(self, request: GatewayRequest, entry: ToolEntry) -> None:
        """Hold a ``tools/call`` of ``entry`` when content of another server tainted the session: ask a person, or
        refuse (raises the refusal)."""
        known = taint_sources(request.session)
        mode = self._mode(entry.server)
        if not known or mode == "off":
            return
        tainted = {server: source for server, source in known.items() if self._mode(server) != "off"}
        sources = held_by(entry, tainted)
        if not sources:
            return
        target = entry.exposed_name
        if mode == "refuse":
            self._tell(request, "refused", entry.server, target, "tainted-session", "taint-refuse", explain(sources))
            raise self._refusal(entry, sources, "guardrails.taint is \"refuse\" for this server")
        if request.person_approved:
            self._tell(request, "approved", entry.server, target, "tainted-session", "taint-approve",
                       f"a person approved the call, told of {explain(sources)}")
            return
        if entry.pre_approved and not flagged_among(request.session, sources):
            # The user approves this tool in their client already; only content the scan flagged as instructions to
            # the model is reason enough to ask about it after all.
            self._tell(request, "approved", entry.server, target, "tainted-session", "taint-approve",
                       f"approved in advance by the client's file (autoApprove/alwaysAllow), after {explain(sources)}")
            return
        problem = await self._ask(request, entry, question(entry, sources))
        if problem is not None:
            self._tell(request, "refused", entry.server, target, "tainted-session", "taint-approve",
                       f"{problem}; after {explain(sources)}")
            raise self._refusal(entry, sources, problem)
        self._tell(request, "approved", entry.server, target, "tainted-session", "taint-approve",
                   f"a person approved the call, told of {explain(sources)}")

    async def _ask(self, request: GatewayRequest, entry: ToolEntry, message: str) -> str | None:
        return await ask_someone(self._config, request, entry, message, self.out_of_band, self.client_approves)

    @staticmethod
    def _refusal(entry: ToolEntry, sources: list[TaintSource], why: str) -> GatewayError:
        return GatewayError(
            TAINT_REFUSED,
            f"Call to '{entry.exposed_name}' refused: this session read content that could steer the model "
            f"({explain(sources)}), and '{entry.original_name}' on server '{entry.server}' is not read-only: {why}",
            {"guardrail": "taint", "rule": "tainted-session",
             "taintedBy": [{"server": s.server, "target": s.target, "reason": s.reason} for s in sources]},
        )

    def _tell(self, request: GatewayRequest, action: str, server: str, target: str, kind: str, rule: str,
              detail: str) -> None:
        self._report.report(Intervention("taint", action, server, target, kind, rule, detail,
                                         request.session.session_id, request.session.identity))


def build(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView) -> TaintGuard | None:
    if not config.on_anywhere("taint"):
        return None
    return TaintGuard(config, report)


def build_recall(config: GuardrailsConfig, report: InterventionLog, catalog: CatalogView,
                 state: StateStore | None = None) -> TaintRecall | None:
    """The per-caller memory of 2026-07-28 requests' taint, in ``state`` (the gateway's store: every chain and
    replica on it shares it; a store of its own without one)."""
    if not config.on_anywhere("taint"):
        return None
    return TaintRecall(TaintMemory(state or MemoryStore(), config.cross_server.taint_memory_seconds), report)
