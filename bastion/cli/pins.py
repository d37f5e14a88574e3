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
from bastion.pin_review import BY_NAME as _BY_NAME
from bastion.pin_review import identities as _identities
from bastion.pin_review import rows as _rows
from bastion.pin_review import way_out as _way_out
from bastion.pin_review import scan_modes
from bastion.pin_review import where as _where


def register(subparsers: Any) -> None:
    pins = subparsers.add_parser(
        "pins", help="tool, prompt and template definitions pinned on first use, and changes withheld since",
        description="Servers' tools, prompts and resource templates are pinned as first seen, per configuration "
                    "file and server name; a definition that changes later is withheld until accepted here.")
    commands = pins.add_subparsers(dest="pins_command", required=True)
    listing = commands.add_parser("list", help="every pinned definition and whether a change of it is withheld")
    listing.add_argument("--json", action="store_true", help="the pins as a JSON array on stdout")
    diff = commands.add_parser("diff", help="every reason each withheld definition is withheld, with a readable diff")
    diff.add_argument("target", nargs="?", metavar="SERVER[/NAME]", help="one server, or one of its definitions")
    diff.add_argument("--json", action="store_true", help="the withheld definitions as a JSON array on stdout")
    accept = commands.add_parser("accept", help="trust what a server offers now instead of what was pinned")
    accept.add_argument("target", metavar="SERVER[/NAME]", help="a server (all its withheld changes) or one definition")
    forget = commands.add_parser(
        "forget", help="drop what is pinned of a server or of one definition: what it offers next is trusted afresh")
    forget.add_argument("target", metavar="SERVER[/NAME]", help="a server (everything of it) or one definition")
    for command, handler in ((listing, _list), (diff, _diff), (accept, _accept), (forget, _forget)):
        command.add_argument("--config", "-c", metavar="FILE",
                             help="the configuration whose guardrails.pins.path to use (default: the state directory's "
                                  "pins.json), or whose [state] store replicas share (the pins are there); its "
                                  "servers are the ones meant, unless --of says otherwise")
        command.add_argument("--of", metavar="FILE",
                             help="only the servers of this configuration file (it need not exist any more); '-' for "
                                  "pins kept by server name alone (from before pins were kept per configuration file)")
        command.set_defaults(handler=handler)


def _say(message: str) -> None:
    print(f"bastion pins: {message}", file=sys.stderr)


def _config(args: argparse.Namespace) -> Any:
    if args.config is None:
        return None
    from bastion.config import load_config

    return load_config(Path(args.config), log_notes=False)


def _store(config: Any, shared: Any) -> Any:
    """The pins of the shared state store when ``--config``'s ``[state]`` names one (``shared``), else the file."""
    from bastion.guardrails.config import GuardrailsConfig
    from bastion.guardrails.pin_store import PinStore

    if shared is not None:
        from bastion.guardrails.pin_state import StatePins

        return StatePins(*shared)
    return PinStore(((config.guardrails if config is not None else None) or GuardrailsConfig()).pins_path())


def _scope(book: Any, server: str | None, args: argparse.Namespace) -> str | None:
    """The configuration file the command is about (``_BY_NAME`` for pins by name alone), None for every one:
    ``--of`` strictly; ``--config`` when that file has pins of ``server`` (else it only names the pins file)."""
    if args.of is not None:
        return _BY_NAME if args.of == "-" else str(Path(args.of).expanduser().resolve())
    if args.config is not None:
        mine = str(Path(args.config).expanduser().resolve())
        if _identities(book, server, mine):
            return mine
    return None


def _run(args: argparse.Namespace, command: Any) -> int:
    from bastion.config import ConfigError
    from bastion.guardrails.pin_store import PinStoreError

    from bastion.cli.shared_state import shared_state

    try:
        config = _config(args)
        with shared_state(config) as shared:
            return command(_store(config, shared))
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


def _unknown(book: Any, server: str | None, name: str | None, of: str | None) -> str | None:
    """Why ``server``/``name`` of ``of`` names nothing in the pins, or None when it names something."""
    from bastion.guardrails.pin_book import split_id

    where = "" if of is None else f" of {of or 'no configuration file'}"
    if server is None:
        if of is not None and not _identities(book, None, of):
            return f"no pins{where}; `bastion pins list` shows which configurations have pins"
        return None
    chosen = _identities(book, server, of)
    if not chosen:
        servers = sorted({split_id(s)[1] for s in _identities(book, None, of)})
        return (f"no pins of a server {server!r}{where}; servers with pins{where}: {', '.join(servers) or 'none yet'} "
                "(a server is pinned when Bastion first lists its tools)")
    if name is not None and not any(s in chosen and key == name for s, _, key in book.records):
        return f"server {server!r} has no pinned tool, prompt or template {name!r}; `bastion pins list` shows them"
    return None


def _one(servers: list[str], what: str) -> str | None:
    """Why a command that changes pins cannot act on ``servers`` at once (several configurations have a server of
    that name, and it would be a guess which is meant), or None."""
    if len(servers) < 2:
        return None
    return (f"{what} is pinned for {len(servers)} configurations: {'; '.join(_where(s) for s in servers)}; say which "
            "with --of FILE (--of - for the pins kept by name alone)")


# ------------------------------------------------------------------------------------------ the commands
def _list(args: argparse.Namespace) -> int:
    def command(store: Any) -> int:
        book, _ = store.load()
        of = _scope(book, None, args) if args.of is not None else None  # --config alone lists every one's pins
        if (why := _unknown(book, None, None, of)) is not None:
            _say(why)
            return EXIT_USAGE
        rows = _rows(book, _identities(book, None, of), None, withheld_only=False)
        if args.json:
            print(json.dumps([{k: v for k, v in row.items() if k not in ("pinned", "offered", "reasons")}
                              for row in rows], indent=2))
            return EXIT_OK
        if not rows:
            _say(f"nothing pinned yet in {store.path}")
            return EXIT_OK
        configured = any(row["configuration"] for row in rows)
        table = [("SERVER", "KIND", "NAME", "STATUS", "PINNED", "CONFIGURATION")]
        for row in rows:
            status = row["status"] if row["status"] == "pinned" else f"{row['status']}, withheld"
            table.append((row["server"], row["kind"], row["name"], status, row["pinned_at"] or "-",
                          row["configuration"] or "-"))
        widths = [max(len(r[i]) for r in table) for i in range(5)]
        for row in table:
            # A column of configuration files only when some server has one: a pins file of before has none.
            cells = row[:5] if configured else row[:4]
            print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + "  " + row[len(cells)])
        return EXIT_OK

    return _run(args, command)


def _known_book(store: Any, server: str | None, name: str | None, args: argparse.Namespace,
                ) -> tuple[Any, str | None]:
    """The pins and the configuration meant (``_scope``), when they know ``server`` (and ``name``) there; None,
    having said why, when they do not."""
    book, _ = store.load()
    of = _scope(book, server, args)
    if (why := _unknown(book, server, name, of)) is not None:
        _say(why)
        return None, of
    return book, of


def _diff(args: argparse.Namespace) -> int:
    from bastion.guardrails.pin_diff import unified

    server, name = _target(args.target)

    def command(store: Any) -> int:
        book, of = _known_book(store, server, name, args)
        if book is None:
            return EXIT_USAGE
        servers = _identities(book, server, of)
        rows = _rows(book, servers, name, withheld_only=True, modes=scan_modes(servers, _say))
        if args.json:
            print(json.dumps(rows, indent=2, ensure_ascii=False))
            return EXIT_OK
        if not rows:
            _say(f"nothing withheld{f' of {args.target}' if args.target else ''}: every definition offered matches "
                 "its pin, and the metadata scan finds nothing in them")
            return EXIT_OK
        for row in rows:
            reference = f"{row['server']}/{row['name']}"
            if row["status"] == "renamed":
                head = f"{reference} ({row['kind']}): withheld, a new name for {row['kind']} {row['matches']!r}"
                before_label = f"{row['server']}/{row['matches']} (pinned)"
            elif row["status"] == "changed":
                head = f"{reference} ({row['kind']}): withheld, changed since it was pinned {row['pinned_at']}"
                before_label = f"{reference} pinned {row['pinned_at']}"
            else:
                head = f"{reference} ({row['kind']}): withheld, pinned {row['pinned_at']}"
                before_label = ""
            print(head)
            print(f"  configuration: {row['configuration'] or _where(row['server'])}")
            for reason in row["reasons"]:
                print(f"  withheld: {reason['text']}")
            for change in row.get("changes", []):
                print(f"  * {change}")
            if row["offered"] is not None:
                print(unified(row["pinned"], row["offered"], before_label, f"{reference} offered {row['offered_at']}"),
                      end="")
            print(f"  {_way_out(book, row)}\n")
        return EXIT_OK

    return _run(args, command)


def _accept(args: argparse.Namespace) -> int:
    from bastion.guardrails.pin_book import SINGULAR

    server, name = _target(args.target)

    def command(store: Any) -> int:
        book, of = _known_book(store, server, name, args)
        if book is None:
            return EXIT_USAGE
        # Only the configurations with something to accept count: a namesake with nothing withheld is no doubt.
        pending = [s for s in _identities(book, server, of) if any(
            a == s and (name is None or key == name) and r.offered is not None for (a, _, key), r in book.records.items())]
        if (why := _one(pending, f"server {server!r} has changes withheld and")) is not None:
            _say(why)
            return EXIT_USAGE
        if not pending:
            _say(f"nothing to accept for {args.target}: nothing of it is withheld by a changed definition")
            _still_withheld(book, _identities(book, server, of), name)
            return EXIT_FAILED
        who = getpass.getuser()
        accepted, after = store.accept(pending[0], name, by=who)
        for s, kind, key in accepted:
            print(f"accepted {server}/{key} ({SINGULAR[kind]})")
        _say(f"accepted {len(accepted)} change{'s' if len(accepted) != 1 else ''} of server {server!r} of "
             f"{_where(pending[0])}")
        _still_withheld(after, pending, None)
        _say(f"recorded as accepted by {who} in {store.reviews_path}")
        _say("running gateways serve the accepted definitions at the next list or call")
        return EXIT_OK

    return _run(args, command)


def _still_withheld(book: Any, servers: list[str], name: str | None) -> None:
    """Say what of ``servers`` stays withheld, and why, after an acceptance."""
    rows = _rows(book, servers, name, withheld_only=True, modes=scan_modes(servers, _say))
    for row in rows:
        why = "; ".join(reason["text"] for reason in row["reasons"])
        _say(f"{row['kind']} {row['name']!r} of server {row['server']!r} stays withheld: {why} "
             f"({_way_out(book, row)})")


def _forget(args: argparse.Namespace) -> int:
    from bastion.guardrails.pin_book import SINGULAR

    server, name = _target(args.target)

    def command(store: Any) -> int:
        book, of = _known_book(store, server, name, args)
        if book is None:
            return EXIT_USAGE
        chosen = _identities(book, server, of)
        if (why := _one(chosen, f"server {server!r}")) is not None:
            _say(why)
            return EXIT_USAGE
        for s, kind, key in store.forget(chosen[0], name):
            print(f"forgot {server}/{key} ({SINGULAR[kind]})")
        _say("what the server offers is trusted on first use again: the next gateway to judge it pins it afresh")
        return EXIT_OK

    return _run(args, command)
