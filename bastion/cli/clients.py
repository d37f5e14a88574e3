"""``bastion import`` and ``bastion client install|uninstall``: from the configuration a client has to Bastion.

The review (what each server may read, write, reach and receive) is the command's answer, so it is printed on
stdout (JSON with ``--json``); what was written where, and anything refused, goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from bastion.cli.conventions import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def register(subparsers: Any) -> None:
    importer = subparsers.add_parser(
        "import", help="write one Bastion configuration from your MCP clients' configurations, and review it",
        description="Read the server configurations of Claude Desktop, Claude Code, Cursor, VS Code and Windsurf "
                    "(or the FILEs given), merge them into one Bastion configuration with sandbox grants inferred "
                    "from each server's arguments, and print what each server may read, write, reach and receive.")
    importer.add_argument("files", nargs="*", metavar="FILE", help="client configuration files (default: find them)")
    importer.add_argument("--output", "-o", metavar="PATH",
                          help="where to write it (default: $XDG_CONFIG_HOME/bastion/bastion.toml)")
    importer.add_argument("--force", action="store_true", help="replace an existing output (a backup is kept)")
    importer.add_argument("--allow-home", action="store_true",
                          help="grant a server your whole home directory when its arguments name it")
    importer.add_argument("--dry-run", action="store_true", help="print the review, write nothing")
    importer.add_argument("--json", action="store_true", help="print the review as JSON on stdout")
    importer.set_defaults(handler=run_import)

    client = subparsers.add_parser("client", help="point an MCP client at Bastion, or back")
    commands = client.add_subparsers(dest="client_command", required=True)
    from bastion.clients.discovery import CLIENTS

    install = commands.add_parser(
        "install", help="make CLIENT start Bastion instead of its servers (its file is backed up first)",
        description="Replace CLIENT's servers by one 'bastion' entry that runs `bastion run CONFIG`. Its file is "
                    "copied to a timestamped backup first. When the Bastion configuration does not exist yet, the "
                    "client's servers are imported into it first.")
    install.add_argument("client", choices=sorted(CLIENTS), metavar="CLIENT", help=", ".join(sorted(CLIENTS)))
    install.add_argument("--config", metavar="BASTION_FILE",
                         help="the Bastion configuration it runs (default: $XDG_CONFIG_HOME/bastion/bastion.toml)")
    install.add_argument("--allow-home", action="store_true", help="as for `bastion import`")
    install.set_defaults(handler=run_install)

    uninstall = commands.add_parser("uninstall", help="put CLIENT's file back as it was before install")
    uninstall.add_argument("client", choices=sorted(CLIENTS), metavar="CLIENT", help=", ".join(sorted(CLIENTS)))
    uninstall.add_argument("--force", action="store_true", help="restore the backup even if the file changed since")
    uninstall.set_defaults(handler=run_uninstall)


def _say(message: str) -> None:
    print(f"bastion: {message}", file=sys.stderr)


def default_output() -> Path:
    from bastion import paths

    return paths.config_dir() / "bastion.toml"


def run_import(args: argparse.Namespace) -> int:
    from bastion.clients.discovery import Places, client_of, discover, read_client_file

    places = Places.current()
    if args.files:
        sources = []
        for given in args.files:
            path = Path(given)
            spec = client_of(path, places)
            sources.append((spec.label if spec else "file", path))
    else:
        sources = [(spec.label, path) for spec, path in discover(places)]
        if not sources:
            _say("found no client configuration (Claude Desktop, Claude Code, Cursor, VS Code, Windsurf); give "
                 "the file to import: bastion import FILE")
            return EXIT_FAILED
    files = [read_client_file(path, label, places.home, expect_servers=bool(args.files)) for label, path in sources]
    return _import_files(files, Path(args.output) if args.output else default_output(), places.home,
                         force=args.force, allow_home=args.allow_home, dry_run=args.dry_run, as_json=args.json)


def _carry_locks(written: Path, result: Any) -> None:
    """The imported servers' package versions, already installed and locked for the client's file, carried over to
    the new file's lock: its first start reuses them instead of resolving and installing them again."""
    from bastion.config import ConfigError, load_config
    from bastion.launchers.lock import LockFileError
    from bastion.launchers.prepare import carry_over, config_lock_path

    try:
        config = load_config(written, log_notes=False)
        carried = carry_over([(server.name, server.found.name, server.found.file) for server in result.servers],
                             config)
    except (ConfigError, LockFileError) as exc:
        _say(f"the client files' lock entries were not carried over ({exc}); the first start resolves them again")
        return
    if carried:
        _say(f"carried the locked versions of {', '.join(carried)} over to {config_lock_path(config)}")


def _import_files(files: list[Any], output: Path, home: Path, *, force: bool, allow_home: bool, dry_run: bool,
                  as_json: bool) -> int:
    from bastion.clients.importer import ImportRefused, import_servers, render_toml, write_configuration

    problems = [problem for file in files for problem in file.problems]
    found = [server for file in files for server in file.servers]
    from bastion import paths

    # The dry run makes the very plan the import makes, so its review is the import's: a memory server is given its
    # file in Bastion's state folder either way (that folder is made so that its grant is the one the import gets).
    result = import_servers(found, home=home, allow_home=allow_home, memory_dir=paths.state_dir() / "memory")
    text = render_toml(result, [f"{file.label}: {file.path}" for file in files if file.servers])
    error = _invalid(text)
    written = backup = None
    if error is None and result.servers and not dry_run:
        try:
            backup = write_configuration(output, text, force=force)
            written = output
        except ImportRefused as refused:
            error = str(refused)
        except OSError as failure:
            error = f"{output}: cannot write it: {failure.strerror}"
    if as_json:
        print(json.dumps({"output": str(written) if written else None, "backup": str(backup) if backup else None,
                          "servers": [server.review.as_dict() for server in result.servers],
                          "renamed": result.renamed, "duplicates": result.duplicates, "skipped": result.skipped,
                          "problems": problems, "error": error}, indent=2))
    else:
        _print_review(result, problems)
    if error is not None:
        _say(error)
        return EXIT_USAGE
    if not result.servers:
        _say("no local server to import")
        return EXIT_FAILED
    if backup is not None:
        _say(f"the previous {output} is kept as {backup}")
    if written is not None:
        _carry_locks(written, result)
        _say(f"wrote {written} ({len(result.servers)} servers); check it with `bastion check {written}` and "
             f"run it with `bastion run {written}`, or point a client at it with `bastion client install CLIENT`")
    else:
        _say("dry run: nothing written")
    return EXIT_OK


def _invalid(text: str) -> str | None:
    """Why the written configuration would not load, if it would not (a bug here, not the user's)."""
    from pydantic import ValidationError

    from bastion.config import GatewayConfig

    try:
        GatewayConfig.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValidationError) as error:
        return f"the configuration import would write is not valid, nothing written: {error}"
    return None


def _print_review(result: Any, problems: list[str]) -> None:
    lines: list[str] = []
    for server in result.servers:
        lines.extend(server.review.lines())
        lines.append("")
    for title, items in (("renamed", result.renamed), ("imported once", result.duplicates),
                         ("not imported", result.skipped), ("problems", problems)):
        if items:
            lines.append(f"{title}:")
            lines.extend(f"  {item}" for item in items)
    print("\n".join(lines).rstrip())


def run_install(args: argparse.Namespace) -> int:
    from bastion import paths
    from bastion.clients.discovery import CLIENTS, Places, read_client_file
    from bastion.clients.install import InstallError, install

    spec = CLIENTS[args.client]
    places = Places.current()
    client_file = places.user_file(spec)
    configuration = Path(args.config) if args.config else default_output()
    if not configuration.exists():
        client = read_client_file(client_file, spec.label, places.home) if client_file.exists() else None
        if client is None or not client.servers:
            _say(f"{configuration} does not exist and {client_file} has no servers to import into it; write it "
                 f"(`bastion import FILE --output {configuration}`) or give one with --config")
            return EXIT_USAGE
        # Only the servers this file starts for every project are replaced by Bastion's entry; so only those move.
        client.servers = [server for server in client.servers if not server.table.startswith("projects.")]
        from bastion.clients.importer import is_remote_entry

        if client.servers and all(is_remote_entry(server.entry) for server in client.servers):
            _say(f"every server of {client_file} is remote ({', '.join(s.name for s in client.servers)}): {spec.label} "
                 "reaches them directly and keeps them, so there is nothing to put behind Bastion; nothing was "
                 "changed (to federate them, write a configuration with their url and headers, docs/http.md, and "
                 "give it with --config)")
            return EXIT_FAILED
        status = _import_files([client], configuration, places.home, force=False, allow_home=args.allow_home,
                               dry_run=False, as_json=False)
        if status != EXIT_OK:
            return status
    else:
        refusal = _not_runnable(configuration)
        if refusal:
            _say(refusal)
            return EXIT_USAGE
        _warn_about_servers_left_behind(client_file, spec, places, configuration)
    try:
        installed = install(spec, client_file, configuration, paths.state_dir())
    except InstallError as error:
        _say(str(error))
        return EXIT_USAGE
    if installed.backup:
        _say(f"{spec.label}'s file {client_file} is backed up as {installed.backup}")
    _say(f"{spec.label} now starts Bastion: {' '.join(installed.command)}; restart {spec.label} to use it, and "
         f"`bastion client uninstall {spec.key}` to undo")
    if installed.remote:
        _say(f"kept in {client_file}: the remote server{'s' if len(installed.remote) > 1 else ''} "
             f"{', '.join(installed.remote)}, which {spec.label} keeps reaching directly, not through Bastion (to put "
             "one behind Bastion, add it to the configuration with url and headers, docs/http.md, and remove it "
             "from the client's file)")
    if spec.key == "claude-code":
        _say("servers Claude Code keeps per project (projects.*.mcpServers in ~/.claude.json, a project's "
             ".mcp.json) still start directly; import them with `bastion import` and remove them there")
    if spec.key == "vscode":
        _say("servers in VS Code's settings.json (mcp.servers) and a workspace's .vscode/mcp.json still start "
             "directly; import them with `bastion import` and remove them there")
    return EXIT_OK


def _not_runnable(configuration: Path) -> str | None:
    from bastion.config import ConfigError, load_config

    try:
        load_config(configuration, log_notes=False)
    except ConfigError as error:
        return f"{error}\nnothing was changed: the client would start a configuration that does not load"
    return None


def _warn_about_servers_left_behind(client_file: Path, spec: Any, places: Any, configuration: Path) -> None:
    """The client's servers the configuration has no server of the same name for: they stop starting."""
    from bastion.clients.discovery import read_client_file
    from bastion.config import load_config

    if not client_file.exists():
        return
    mine = set(load_config(configuration, log_notes=False).servers)
    client = read_client_file(client_file, spec.label, places.home)
    from bastion.clients.importer import is_remote_entry

    missing = [server.name for server in client.servers  # a remote entry stays in the client's file
               if not server.table.startswith("projects.") and server.name not in mine
               and not is_remote_entry(server.entry)]
    if missing:
        _say(f"{configuration} has no server named {', '.join(missing)}: once {spec.label} starts Bastion they "
             f"will not start (they stay in the backup); add them with `bastion import {client_file} --output "
             f"FILE` and merge, or uninstall")


def run_uninstall(args: argparse.Namespace) -> int:
    from bastion import paths
    from bastion.clients.discovery import CLIENTS
    from bastion.clients.install import InstallError, uninstall

    spec = CLIENTS[args.client]
    try:
        done = uninstall(spec, paths.state_dir(), force=args.force)
    except InstallError as error:
        _say(str(error))
        return EXIT_USAGE
    if done.how == "removed":
        _say(f"removed {done.client_file}, which install had created; restart {spec.label}")
    elif done.how == "servers restored":
        _say(f"{done.client_file} changed since install outside its servers: its servers are restored from "
             f"{done.backup}, the rest kept as it is now; restart {spec.label}")
    else:
        _say(f"restored {done.client_file} from {done.backup}; restart {spec.label}")
    return EXIT_OK
