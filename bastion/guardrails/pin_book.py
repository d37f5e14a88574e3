"""Trust on first use, decided: the first definitions each server offered, and the verdict on what it offers now.

A ``PinBook`` holds one ``PinRecord`` per (server, kind, key): the definition a person trusts (the first one seen,
or the one accepted later) and, when the server has offered something else since, that offer, kept for
``bastion pins diff`` and ``bastion pins accept``. ``judge`` compares what a server offers with the book; it reads
nothing and writes nothing, so every rule here is tested without a file or a gateway.

Kinds are ``tools`` and ``prompts`` (keyed by the server's own name) and ``resourceTemplates`` (keyed by their
``name``, else their ``uriTemplate``).

A server is pinned under its identity: the configuration file it is configured in and its name there
(``server_id``), so two projects' ``filesystem`` servers are two servers, never one that changed. Its command,
url and package are not part of the identity but its pinned configuration entry: an edit of them in the same file
is drift to review, not a new server trusted on first use. A server of a configuration that is no file (the
built-in one) and pins written before identities (version 1 files) are keyed by name alone; ``claim`` hands such
pins, and those of a configuration file that is gone (a moved file), to the first identity whose entry they match.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from bastion.guardrails.pin_diff import Change, describe_changes, same

# ``entry``: the server's configuration entry (bastion/server_entry.py), under ENTRY_KEY, pinned with its
# definitions: while a changed entry is withheld, so is everything the server offers.
ENTRY_KIND = "entry"
ENTRY_KEY = "@entry"  # not a valid tool name (letters, digits, _ - . /), so no definition's key is ever it
KINDS = ("tools", "prompts", "resourceTemplates", ENTRY_KIND)
SINGULAR = {"tools": "tool", "prompts": "prompt", "resourceTemplates": "resource template",
            ENTRY_KIND: "configuration entry"}
# What a rename leaves as it was: comparing the rest tells a renamed definition from a new one.
_NAMING_FIELDS = ("name", "title")


def item_key(kind: str, definition: Mapping[str, Any]) -> str:
    """The key a definition is pinned under: its name (a template without one: its uriTemplate)."""
    name = definition.get("name")
    if kind == "resourceTemplates" and not (isinstance(name, str) and name):
        return str(definition.get("uriTemplate", ""))
    return str(name)


@dataclass(frozen=True, slots=True)
class PinRecord:
    pinned: Mapping[str, Any] | None = None  # the trusted definition; None for an offer never accepted
    pinned_at: str | None = None
    offered: Mapping[str, Any] | None = None  # what the server offers instead, withheld until accepted
    offered_at: str | None = None
    matches: str | None = None  # a new key whose definition is that of this key of the same server: a rename

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("pinned", self.pinned), ("pinned_at", self.pinned_at), ("offered", self.offered),
                                  ("offered_at", self.offered_at), ("matches", self.matches)) if v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PinRecord":
        return cls(pinned=data.get("pinned"), pinned_at=data.get("pinned_at"), offered=data.get("offered"),
                   offered_at=data.get("offered_at"), matches=data.get("matches"))


Address = tuple[str, str, str]  # (server identity, kind, key)


def server_id(name: str, configuration: str | None) -> str:
    """The identity a server is pinned under: ``name`` in the configuration file ``configuration`` (a resolved
    path), or ``name`` alone for a configuration that is no file. A name holds no "/", so the identity splits back."""
    return name if configuration is None else f"{configuration}/{name}"


def split_id(server: str) -> tuple[str | None, str]:
    """(configuration file or None, server name) of a pinned identity."""
    configuration, _, name = server.rpartition("/")
    return (configuration or None), name


@dataclass(frozen=True, slots=True)
class PinBook:
    records: Mapping[Address, PinRecord] = field(default_factory=dict)

    def get(self, server: str, kind: str, key: str) -> PinRecord | None:
        return self.records.get((server, kind, key))

    def of(self, server: str, kind: str) -> dict[str, PinRecord]:
        return {key: record for (s, k, key), record in self.records.items() if s == server and k == kind}

    def knows(self, server: str, kind: str) -> bool:
        """Whether anything of this server and kind was ever recorded: if not, what it offers is its first."""
        return any(s == server and k == kind for (s, k, _) in self.records)

    def to_json(self) -> dict[str, Any]:
        """Version 2: servers pinned by name alone under ``servers`` (where version 1 kept them all, so an older
        Bastion still reads those), servers of a configuration file under ``configurations``, by file and name."""
        servers: dict[str, dict[str, dict[str, Any]]] = {}
        configurations: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        for (server, kind, key), record in sorted(self.records.items()):
            configuration, name = split_id(server)
            holder = servers if configuration is None else configurations.setdefault(configuration, {})
            holder.setdefault(name, {}).setdefault(kind, {})[key] = record.to_json()
        return {"version": 2, "servers": servers, "configurations": configurations}

    @classmethod
    def from_json(cls, data: Any) -> "PinBook":
        """A book from the pins file's JSON (version 1 or 2); ValueError saying what is wrong where, for a file
        that is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("servers"), dict):
            raise ValueError('the top level must be an object with a "servers" object')
        configurations = data.get("configurations", {})
        if not isinstance(configurations, dict) or not all(
                isinstance(servers, dict) and path.startswith("/") for path, servers in configurations.items()):
            raise ValueError('"configurations" must be an object mapping configuration files (absolute paths) to '
                             "their servers")
        records: dict[Address, PinRecord] = {}
        groups = [(None, "servers", data["servers"]),
                  *((path, f"configurations.{path}", servers) for path, servers in configurations.items())]
        for configuration, at, servers in groups:
            for name, kinds in servers.items():
                server = server_id(name, configuration)
                if not isinstance(kinds, dict) or "/" in name:
                    raise ValueError(f"{at}.{name} must be an object, under a server name without '/'")
                for kind, items in kinds.items():
                    if kind not in KINDS or not isinstance(items, dict):
                        raise ValueError(f"{at}.{name}.{kind}: the kinds are {', '.join(KINDS)}, each an object")
                    for key, record in items.items():
                        if not isinstance(record, dict) or not any(
                                isinstance(record.get(part), dict) for part in ("pinned", "offered")):
                            raise ValueError(f"{at}.{name}.{kind}.{key} must be an object with a pinned or an "
                                             "offered definition")
                        records[(server, kind, key)] = PinRecord.from_json(record)
        return cls(records)

    def servers(self) -> list[str]:
        """Every pinned identity, sorted."""
        return sorted({server for server, _, _ in self.records})


# ------------------------------------------------------------------------------------------ verdicts
TRUSTED = "trusted"  # what was pinned: served
FIRST_SEEN = "first-seen"  # nothing pinned under this key yet and not a rename: pinned now, served
CHANGED = "changed"  # differs from what was pinned: withheld
RENAMED = "renamed"  # a new key carrying a known or withheld definition: withheld


@dataclass(frozen=True, slots=True)
class Verdict:
    status: str
    changes: tuple[Change, ...] = ()
    since: str | None = None  # when the trusted definition was pinned
    matches: str | None = None  # RENAMED: the key whose definition it carries
    why: str = ""  # RENAMED: whose definition, in words

    @property
    def withheld(self) -> bool:
        return self.status in (CHANGED, RENAMED)


SERVED = Verdict(TRUSTED)
NEW = Verdict(FIRST_SEEN)


def judge(book: PinBook, server: str, kind: str, key: str, definition: Mapping[str, Any],
          present: Iterable[str] = ()) -> Verdict:
    """The verdict on ``definition``, offered by ``server`` under ``key``; ``present`` are the keys the server
    offers now besides it (a definition whose key has gone may come back under another)."""
    record = book.get(server, kind, key)
    if record is not None and record.pinned is not None:
        if same(record.pinned, definition):
            return SERVED
        return Verdict(CHANGED, tuple(describe_changes(record.pinned, definition)), since=record.pinned_at)
    if not book.knows(server, kind):
        return NEW
    if record is not None and record.matches is not None:
        # Once taken for a rename, an offer stays withheld until a person accepts it, whatever it becomes.
        again = rename_of(book, server, kind, key, definition, set(present))
        if again is not None and again.matches == record.matches:
            return again
        return _renamed(record.matches, book.get(server, kind, record.matches), definition, kind,
                        f"it was first offered with the definition of {SINGULAR[kind]} {record.matches!r}")
    return rename_of(book, server, kind, key, definition, set(present)) or NEW


def rename_of(book: PinBook, server: str, kind: str, key: str, definition: Mapping[str, Any],
              present: set[str]) -> Verdict | None:
    """A new key of a server whose definition is one the server offered under another key is that one renamed:
    the definition of a pinned one, the changed one of a withheld one, or (for tools, whose whole list is known)
    the description of one that is gone."""
    body = _without_naming(definition)
    description = definition.get("description")
    for other, record in sorted(book.of(server, kind).items()):
        if other == key:
            continue
        if record.pinned is not None and same(_without_naming(record.pinned), body):
            return _renamed(other, record, definition, kind, f"it carries the same definition as {SINGULAR[kind]} {other!r}")
        if record.offered is not None and same(_without_naming(record.offered), body):
            return _renamed(other, record, definition, kind,
                            f"it carries the changed definition of {SINGULAR[kind]} {other!r}, which is withheld")
    if kind != "tools" or not (isinstance(description, str) and description.strip()):
        return None
    for other, record in sorted(book.of(server, kind).items()):
        if other != key and other not in present and record.pinned is not None \
                and record.pinned.get("description") == description:
            return _renamed(other, record, definition, kind,
                            f"it carries the description of {SINGULAR[kind]} {other!r}, which the server no longer offers")
    return None


def _renamed(other: str, record: PinRecord | None, definition: Mapping[str, Any], kind: str, why: str) -> Verdict:
    source = None if record is None else (record.pinned if record.pinned is not None else record.offered)
    changes = [Change("name", f"a new name for {SINGULAR[kind]} {other!r} ({why})", widens=True)]
    if source is not None:
        changes += [c for c in describe_changes(_without_naming(source), _without_naming(definition))]
    return Verdict(RENAMED, tuple(changes), since=None if record is None else record.pinned_at, matches=other, why=why)


def _without_naming(definition: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in definition.items() if k not in _NAMING_FIELDS}


# ------------------------------------------------------------------------------------------ what to record
@dataclass(frozen=True, slots=True)
class Observation:
    """What a verdict asks the book to remember: ``pin`` a first-seen definition, ``offer`` a withheld one,
    ``settle`` a record whose server went back to what was pinned."""

    action: str  # "pin" | "offer" | "settle"
    server: str
    kind: str
    key: str
    definition: Mapping[str, Any]
    matches: str | None = None


def observation(book: PinBook, server: str, kind: str, key: str, definition: Mapping[str, Any],
                verdict: Verdict) -> Observation | None:
    """What must be written for ``verdict``, or None when the book already says it (so steady lists write nothing)."""
    record = book.get(server, kind, key)
    if verdict.status == FIRST_SEEN:
        return Observation("pin", server, kind, key, definition)
    if verdict.withheld:
        if record is not None and record.offered is not None and same(record.offered, definition) \
                and record.matches == (verdict.matches if verdict.status == RENAMED else None):
            return None
        return Observation("offer", server, kind, key, definition,
                           verdict.matches if verdict.status == RENAMED else None)
    if record is not None and record.offered is not None:
        return Observation("settle", server, kind, key, definition)
    return None


def apply(book: PinBook, observations: Iterable[Observation], now: str) -> PinBook:
    """``book`` with ``observations`` recorded. A pin never replaces one already there (another process may have
    pinned first: its pin stands, and the caller judges again against it)."""
    records = dict(book.records)
    for seen in observations:
        address = (seen.server, seen.kind, seen.key)
        record = records.get(address)
        if seen.action == "pin":
            # Also an offer recorded while its server's entry was held, not a rename: that server is trusted again.
            if record is None or (record.pinned is None and record.matches is None):
                records[address] = PinRecord(pinned=seen.definition, pinned_at=now)
        elif seen.action == "offer":
            base = record if record is not None else PinRecord()
            if base.pinned is not None and same(base.pinned, seen.definition):
                continue
            records[address] = replace(base, offered=seen.definition, offered_at=now,
                                       matches=seen.matches if base.pinned is None else None)
        elif seen.action == "settle":
            if record is not None and record.pinned is not None and same(record.pinned, seen.definition):
                records[address] = PinRecord(pinned=record.pinned, pinned_at=record.pinned_at)
    return PinBook(records)


Offered = tuple[str, str, str, Mapping[str, Any]]  # (server, kind, key, definition)


def reconcile(book: PinBook, offered: Sequence[Offered], now: str, held: frozenset[str] = frozenset(),
              ) -> tuple[PinBook, list[Observation], list[Verdict]]:
    """Judge everything a catalog offers at once: the book with what it asks to record, those records, and each
    item's verdict. A change and a new name that carries it can arrive in one list update, so the changes' offers
    are recorded first and the new names judged against them. What the servers in ``held`` (whose configuration
    entry changed) offer for the first time is recorded as an offer, never pinned: it came from the changed entry,
    and is trusted only when a person accepts that."""
    present: dict[tuple[str, str], set[str]] = {}
    for server, kind, key, _ in offered:
        present.setdefault((server, kind), set()).add(key)

    def verdicts_of(current: PinBook) -> list[Verdict]:
        return [judge(current, server, kind, key, definition, present[(server, kind)])
                for server, kind, key, definition in offered]

    recorded: list[Observation] = []
    verdicts = verdicts_of(book)
    for offers_only in (True, False):
        seen = [o for (server, kind, key, definition), verdict in zip(offered, verdicts)
                if (o := _held(book, observation(book, server, kind, key, definition, verdict), held)) is not None
                and (o.action == "offer" or not offers_only)]
        if seen:
            book = apply(book, seen, now)
            recorded += seen
            verdicts = verdicts_of(book)
    return book, recorded, verdicts


def _held(book: PinBook, seen: Observation | None, held: frozenset[str]) -> Observation | None:
    """``seen``, with a first pin of a held server's definition turned into an offer (None once it is one)."""
    if seen is None or seen.action != "pin" or seen.server not in held:
        return seen
    record = book.get(seen.server, seen.kind, seen.key)
    if record is not None and record.offered is not None and same(record.offered, seen.definition):
        return None
    return replace(seen, action="offer")


def accept(book: PinBook, server: str, key: str | None, now: str) -> tuple[PinBook, list[Address]]:
    """``book`` with the offers of ``server`` (only ``key``'s, in every kind, when given) trusted from now on."""
    records = dict(book.records)
    accepted: list[Address] = []
    for address, record in sorted(book.records.items()):
        if address[0] != server or (key is not None and address[2] != key) or record.offered is None:
            continue
        records[address] = PinRecord(pinned=record.offered, pinned_at=now)
        accepted.append(address)
    return PinBook(records), accepted


def forget(book: PinBook, server: str, key: str | None) -> tuple[PinBook, list[Address]]:
    """``book`` without what it records of ``server`` (only ``key``, in every kind, when given): what the server
    offers next is trusted on first use again."""
    gone = [address for address in sorted(book.records)
            if address[0] == server and (key is None or address[2] == key)]
    return PinBook({a: r for a, r in book.records.items() if a not in set(gone)}), gone


# ------------------------------------------------------------------------------------------ identities
def unclaimed(book: PinBook, server: str, gone: Callable[[str], bool]) -> list[str]:
    """The identities of ``server``'s name whose pins no configuration file holds: pinned by name alone (a version 1
    file), or of a configuration file that is ``gone`` (moved or deleted). ``server`` itself never."""
    configuration, name = split_id(server)
    if configuration is None:
        return []
    return [other for other in book.servers() if other != server and split_id(other)[1] == name
            and ((owner := split_id(other)[0]) is None or gone(owner))]


def claim(book: PinBook, server: str, entry: Mapping[str, Any], gone: Callable[[str], bool],
          ) -> tuple[PinBook, str | None]:
    """``book`` with an unclaimed identity's pins moved to ``server``, when ``server`` has none yet and that
    identity's pinned configuration entry is ``entry`` (the same program: a moved file, an old pins file), and
    the identity they came from; else ``book`` as it is and None. An entry that differs is another server that had
    the name: it keeps its pins, and ``server`` is trusted on first use."""
    if any(s == server for s, _, _ in book.records):
        return book, None
    for other in unclaimed(book, server, gone):
        record = book.get(other, ENTRY_KIND, ENTRY_KEY)
        if record is not None and record.pinned is not None and record.offered is None and same(record.pinned, entry):
            moved = {((server, kind, key) if s == other else (s, kind, key)): r
                     for (s, kind, key), r in book.records.items()}
            return PinBook(moved), other
    return book, None
