"""``bastion keys create NAME``, ``list``, ``revoke NAME``: the API keys ``bastion serve --http`` accepts.

``create`` prints the new key on stdout, once: it is the command's answer (``KEY=$(bastion keys create ci)``), and
the file keeps only its hash, so nobody can show it again. Everything said to people goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bastion.cli.conventions import EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    keys = subparsers.add_parser(
        "keys", help="API keys for bastion serve --http: create, list, revoke",
        description="API keys are named, scoped, expiring credentials for callers OAuth is too much for. The key "
                    "file keeps only each key's hash; a running gateway sees a change within a second.")
    commands = keys.add_subparsers(dest="keys_command", required=True)
    create = commands.add_parser("create", help="make a key and print it (once) on stdout")
    create.add_argument("name", help="the key's name: the identity its caller has in policy, audit and logs")
    create.add_argument("--scope", "-s", action="append", default=[], metavar="SCOPE",
                        help="a scope the key carries (repeat, or separate with spaces or commas)")
    create.add_argument("--groups", "-g", action="append", default=[], metavar="GROUP",
                        help="a group the caller belongs to, a Cedar parent (repeat, or separate with commas)")
    create.add_argument("--expires", "-e", metavar="WHEN",
                        help="when the key stops working: 90m, 12h, 30d, 2w, 1y from now, or a date such as "
                             "2027-01-31 (default: never)")
    listing = commands.add_parser("list", help="every key: name, scopes, groups, created, expires (never the key)")
    listing.add_argument("--json", action="store_true", help="the keys as a JSON array on stdout")
    revoke = commands.add_parser("revoke", help="delete a key: a running gateway refuses it within a second")
    revoke.add_argument("name", help="the key's name, as bastion keys list shows it")
    for command, handler in ((create, _create), (listing, _list), (revoke, _revoke)):
        where = command.add_mutually_exclusive_group()
        where.add_argument("--config", "-c", metavar="FILE", help="the configuration whose auth.api_keys names the "
                                                                  "key file")
        where.add_argument("--file", metavar="PATH", type=Path,
                           help="the key file itself (default: api_keys.json in the state directory)")
        command.set_defaults(handler=handler)


def _say(message: str) -> None:
    print(f"bastion keys: {message}", file=sys.stderr)


def key_file_path(args: argparse.Namespace) -> Path:
    """The key file the command works on: --file, else the configuration's auth.api_keys, else the default."""
    from bastion.auth.api_keys import default_path, resolve

    if args.file is not None:
        return args.file.expanduser()
    if args.config is None:
        return default_path()
    from bastion.config import ConfigError, load_config

    config = load_config(Path(args.config), log_notes=False)
    if config.auth is None or config.auth.api_keys is None:
        raise ConfigError(f"{args.config}: auth.api_keys is not set, so the gateway accepts no API keys; set it to "
                          f'the key file (e.g. api_keys = "{default_path()}"), or give --file', [])
    return resolve(config.auth.api_keys, config.source.parent if config.source is not None else None)


def _run(args: argparse.Namespace, command: Any) -> int:
    from bastion.auth.api_keys import ApiKeyFile, ApiKeyFileError
    from bastion.config import ConfigError

    try:
        return command(ApiKeyFile(key_file_path(args)))
    except ConfigError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ApiKeyFileError, ValueError) as exc:
        _say(str(exc))
        return EXIT_USAGE


def _words(values: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(word for value in values for word in value.replace(",", " ").split()))


def _create(args: argparse.Namespace) -> int:
    from bastion.auth.api_keys import check_name, now_utc, parse_expiry

    def command(keys: Any) -> int:
        check_name(args.name)
        now = now_utc()
        expires = parse_expiry(args.expires, now) if args.expires else None
        key, record = keys.create(args.name, _words(args.scope), _words(args.groups), expires, now)
        print(key, flush=True)
        _say(f"created {record.name!r} in {keys.path} (scopes: {' '.join(record.scopes) or 'none'}; groups: "
             f"{', '.join(record.groups) or 'none'}; expires: {record.expires or 'never'}); this is the only time "
             "the key is shown: keep it now")
        return EXIT_OK

    return _run(args, command)


def _list(args: argparse.Namespace) -> int:
    from bastion.auth.api_keys import now_utc

    def command(keys: Any) -> int:
        records, _ = keys.load()
        now = now_utc().timestamp()
        rows = [{"name": r.name, "scopes": list(r.scopes), "groups": list(r.groups), "created": r.created,
                 "expires": r.expires, "expired": (r.expires_at() or float("inf")) <= now}
                for r in sorted(records.values(), key=lambda r: r.name)]
        if args.json:
            print(json.dumps(rows, indent=2))
            return EXIT_OK
        if not rows:
            _say(f"no keys in {keys.path}; make one with bastion keys create NAME")
            return EXIT_OK
        table = [("NAME", "SCOPES", "GROUPS", "CREATED", "EXPIRES")]
        for row in rows:
            expires = row["expires"] or "never"
            table.append((row["name"], " ".join(row["scopes"]) or "-", ",".join(row["groups"]) or "-",
                          row["created"] or "-", f"{expires} (expired)" if row["expired"] else expires))
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        for row in table:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])
        return EXIT_OK

    return _run(args, command)


def _revoke(args: argparse.Namespace) -> int:
    def command(keys: Any) -> int:
        gone = keys.revoke(args.name)
        if gone is None:
            records, _ = keys.load()
            _say(f"no key named {args.name!r} in {keys.path}; keys: {', '.join(sorted(records)) or 'none'}")
            return EXIT_USAGE
        _say(f"revoked {gone.name!r} (created {gone.created}); a running gateway refuses it within a second")
        return EXIT_OK

    return _run(args, command)

