"""``bastion pins list``, ``diff [SERVER[/NAME]]``, ``accept SERVER[/NAME]``, ``forget SERVER[/NAME]``.

The pins of trust on first use (docs/guardrails.md, "Tool pinning"): what each server offered first, and what it
offers instead and is withheld until a person accepts it. What a command is asked for (the list, the diff, what
was accepted) goes to stdout; messages for people go to stderr.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from bastion.cli.conventions import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    pins = subparsers.add_parser(
        "pins", help="tool, prompt and template definitions pinned on first use, and changes withheld since",
        description="Servers' tools, prompts and resource templates are pinned as first seen; a definition that "
                    "changes later is withheld until accepted here.")
    commands = pins.add_subparsers(dest="pins_command", required=True)
    listing = commands.add_parser("list", help="every pinned definition and whether a change of it is withheld")
    listing.add_argument("--json", action="store_true", help="the pins as a JSON array on stdout")
    diff = commands.add_parser("diff", help="what each withheld definition changed, as a readable diff")
    diff.add_argument("target", nargs="?", metavar="SERVER[/NAME]", help="one server, or one of its definitions")
    diff.add_argument("--json", action="store_true", help="the withheld changes as a JSON array on stdout")
    accept = commands.add_parser("accept", help="trust what a server offers now instead of what was pinned")
    accept.add_argument("target", metavar="SERVER[/NAME]", help="a server (all its withheld changes) or one definition")
    forget = commands.add_parser(
        "forget", help="drop what is pinned of a server or of one definition: what it offers next is trusted afresh")
    forget.add_argument("target", metavar="SERVER[/NAME]", help="a server (everything of it) or one definition")
    for command, handler in ((listing, _list), (diff, _diff), (accept, _accept), (forget, _forget)):
        command.add_argument("--config", "-c", metavar="FILE",
                             help="the configuration whose guardrails.pins.path to use (default: the state directory's "
                                  "pins.json)")
        command.set_defaults(handler=handler)


def _say(message: str) -> None:
    print(f"bastion pins: {message}", file=sys.stderr)


def _store(args: argparse.Namespace) -> Any:
    from bastion.guardrails.config import GuardrailsConfig
    from bastion.guardrails.pin_store import PinStore

    if args.config is None:
        return PinStore(GuardrailsConfig().pins_path())
    from bastion.config import load_config

    config = load_config(Path(args.config), log_notes=False)
    return PinStore((config.guardrails or GuardrailsConfig()).pins_path())


def _run(args: argparse.Namespace, command: Any) -> int:
    from bastion.config import ConfigError
    from bastion.guardrails.pin_store import PinStoreError

    try:
        store = _store(args)
        return command(store)
    except ConfigError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PinStoreError as exc:
        _say(str(exc))
        return EXIT_USAGE


def _target(text: str | None) -> tuple[str | None, str | None]:
    if not text:
        return None, None
    server, _, name = text.partition("/")
    return server, (name or None)


def _rows(book: Any, server: str | None, name: str | None, *, withheld_only: bool) -> list[dict[str, Any]]:
    from bastion.guardrails.pin_book import SINGULAR, judge

    rows = []
    for (s, kind, key), record in sorted(book.records.items()):
        if (server is not None and s != server) or (name is not None and key != name):
            continue
        if record.offered is None:
            if withheld_only:
                continue
            rows.append({"server": s, "kind": SINGULAR[kind], "name": key, "status": "pinned",
                         "pinned_at": record.pinned_at})
            continue
        verdict = judge(book, s, kind, key, record.offered)
        status = "renamed" if verdict.status == "renamed" else "changed"
        rows.append({"server": s, "kind": SINGULAR[kind], "name": key, "status": status,
                     "pinned_at": record.pinned_at, "offered_at": record.offered_at, "matches": record.matches,
                     "changes": [c.summary for c in verdict.changes],
                     "pinned": record.pinned if record.pinned is not None else _source(book, s, kind, record.matches),
                     "offered": record.offered})
    return rows


def _source(book: Any, server: str, kind: str, key: str | None) -> Any:
    record = book.get(server, kind, key) if key is not None else None
    if record is None:
        return None
    return record.pinned if record.pinned is not None else record.offered


def _unknown(book: Any, server: str | None, name: str | None) -> str | None:
    """Why ``server``/``name`` names nothing in the pins, or None when it names something."""
    if server is None:
        return None
    servers = sorted({s for s, _, _ in book.records})
    if server not in servers:
        return (f"no pins of a server {server!r}; servers with pins: {', '.join(servers) or 'none yet'} "
                "(a server is pinned when Bastion first lists its tools)")
    if name is not None and not any(s == server and key == name for s, _, key in book.records):
        return f"server {server!r} has no pinned tool, prompt or template {name!r}; `bastion pins list` shows them"
    return None


# ------------------------------------------------------------------------------------------ the commands
def _list(args: argparse.Namespace) -> int:
    def command(store: Any) -> int:
        book, _ = store.load()
        rows = _rows(book, None, None, withheld_only=False)
        if args.json:
            print(json.dumps([{k: v for k, v in row.items() if k not in ("pinned", "offered")} for row in rows],
                             indent=2))
            return EXIT_OK
        if not rows:
            _say(f"nothing pinned yet in {store.path}")
            return EXIT_OK
        table = [("SERVER", "KIND", "NAME", "STATUS", "PINNED")]
        for row in rows:
            status = row["status"] if row["status"] == "pinned" else f"{row['status']}, withheld"
            table.append((row["server"], row["kind"], row["name"], status, row["pinned_at"] or "-"))
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        for row in table:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])
        return EXIT_OK

    return _run(args, command)


def _known_book(store: Any, server: str | None, name: str | None) -> Any:
    """The pins, when they know ``server`` (and ``name``); None, having said why, when they do not."""
    book, _ = store.load()
    if (why := _unknown(book, server, name)) is not None:
        _say(why)
        return None
    return book


def _diff(args: argparse.Namespace) -> int:
    from bastion.guardrails.pin_book import ENTRY_KEY
    from bastion.guardrails.pin_diff import unified

    server, name = _target(args.target)

    def command(store: Any) -> int:
        book = _known_book(store, server, name)
        if book is None:
            return EXIT_USAGE
        rows = _rows(book, server, name, withheld_only=True)
        if args.json:
            print(json.dumps(rows, indent=2, ensure_ascii=False))
            return EXIT_OK
        if not rows:
            _say(f"nothing withheld{f' of {args.target}' if args.target else ''}: every definition offered matches "
                 "its pin")
            return EXIT_OK
        for row in rows:
            reference = f"{row['server']}/{row['name']}"
            if row["status"] == "renamed":
                head = f"{reference} ({row['kind']}): withheld, a new name for {row['kind']} {row['matches']!r}"
                before_label = f"{row['server']}/{row['matches']} (pinned)"
            else:
                head = f"{reference} ({row['kind']}): withheld, changed since it was pinned {row['pinned_at']}"
                before_label = f"{reference} pinned {row['pinned_at']}"
            print(head)
            for change in row["changes"]:
                print(f"  * {change}")
            print(unified(row["pinned"], row["offered"], before_label, f"{reference} offered {row['offered_at']}"),
                  end="")
            # A changed entry is accepted with what its program offers: the whole server.
            accept = row["server"] if row["name"] == ENTRY_KEY else reference
            print(f"  accept it with: bastion pins accept {accept}\n")
        return EXIT_OK

    return _run(args, command)


def _accept(args: argparse.Namespace) -> int:
    from bastion.guardrails.pin_book import SINGULAR

    server, name = _target(args.target)

    def command(store: Any) -> int:
        book = _known_book(store, server, name)
        if book is None:
            return EXIT_USAGE
        who = getpass.getuser()
        accepted, _ = store.accept(server, name, by=who)
        if not accepted:
            _say(f"nothing to accept for {args.target}: nothing of it is withheld")
            return EXIT_FAILED
        for s, kind, key in accepted:
            print(f"accepted {s}/{key} ({SINGULAR[kind]})")
        _say(f"recorded as accepted by {who} in {store.reviews_path}")
        _say("running gateways serve the accepted definitions at the next list or call")
        return EXIT_OK

    return _run(args, command)


def _forget(args: argparse.Namespace) -> int:
    from bastion.guardrails.pin_book import SINGULAR

    server, name = _target(args.target)

    def command(store: Any) -> int:
        book = _known_book(store, server, name)
        if book is None:
            return EXIT_USAGE
        for s, kind, key in store.forget(server, name):
            print(f"forgot {s}/{key} ({SINGULAR[kind]})")
        _say("what the server offers is trusted on first use again: the next gateway to judge it pins it afresh")
        return EXIT_OK

    return _run(args, command)
