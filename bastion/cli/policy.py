"""``bastion policy check``, ``bastion audit verify``, ``bastion approvals``, ``approve ID``, ``deny ID``.

Messages for people go to stderr and the exit status carries the answer; what a command is asked to list
(``bastion approvals``, a table or ``--json``) goes to stdout, so it can be piped.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # imported by the command that uses it when it runs: `bastion --help` needs none of it
    from bastion.model import ToolEntry

EXIT_USAGE = 2


def _say(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def register(subparsers: Any) -> None:
    policy = subparsers.add_parser("policy", help="policy tools")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser(
        "check",
        help="decide a hypothetical tool call without contacting any server (exit 0 allow, 3 deny, 4 approval)",
    )
    check.add_argument("config", nargs="?", help="config file (TOML or JSON) with a [policy] table and optional tools")
    check.add_argument("--identity", required=True, help="principal name")
    check.add_argument("--group", action="append", default=None, help="principal group (repeatable)")
    check.add_argument("--scope", action="append", default=[], help="a scope of the caller's token (repeatable)")
    check.add_argument("--claim", action="append", default=[], metavar="ATTRIBUTE=VALUE",
                       help="a principal attribute auth.claims.attributes names, e.g. tenant=acme (repeatable)")
    check.add_argument("--authenticated-by", default="configured", choices=["configured", "header", "oauth", "api_key", "mtls"],
                       help="how the caller authenticated (principal.authenticated_by)")
    check.add_argument("--issuer", default=None, help="the caller's token issuer (principal.issuer)")
    check.add_argument("--tool", required=True, help="tool: exposed name, server/name, or name")
    check.add_argument("--args", default="{}", help="the call's arguments as a JSON object")
    check.add_argument("--tool-def", help="the Tool definition as JSON (else the config's tools list)")
    check.add_argument("--server", default="server", help="server of --tool-def (default: server)")
    check.add_argument("--trust", choices=["trusted", "reviewed", "untrusted"], default="untrusted", help="trust of --tool-def's server")
    check.set_defaults(handler=_policy_check)

    audit = subparsers.add_parser("audit", help="audit trail tools")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="check the hash chain of audit files (exit 0 intact, 1 tampered)")
    verify.add_argument(
        "paths", nargs="*",
        help="audit trails (the configured audit.path brings in all its chains and rotated files) or single files; "
             "none: the trail of --config, else the default trail, the state directory's audit.jsonl",
    )
    verify.add_argument("--config", "-c", metavar="FILE",
                        help="verify the trail this configuration writes (its policy.audit.path and key_file)")
    verify.add_argument("--key-file", help="HMAC key file, when the trail was written with one")
    verify.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    verify.set_defaults(handler=_audit_verify)

    for name, helptext, handler in (
        ("approvals", "list calls waiting for approval", _approvals),
        ("approve", "approve a waiting call", _approve),
        ("deny", "deny a waiting call", _deny),
    ):
        command = subparsers.add_parser(name, help=helptext)
        if name != "approvals":
            command.add_argument("id", help="approval id (from bastion approvals)")
        else:
            command.add_argument("--json", action="store_true", help="the waiting calls as a JSON array on stdout")
        command.add_argument("--queue-dir", help="approval queue directory (default: from --config, else the default)")
        command.add_argument("--config", help="config file whose policy.approval.queue_dir to use, or whose [state] "
                                              "store replicas share (the queue is there)")
        command.set_defaults(handler=handler)


def _load(config_path: str | None) -> tuple[Any, list[dict[str, Any]]]:
    from bastion.policy.config import PolicyConfig
    from bastion.policy.engine import load_policy_config

    if config_path is None:
        return PolicyConfig(), []
    return load_policy_config(Path(config_path))


def _find_tool(entries: list[ToolEntry], name: str) -> ToolEntry | None:
    for entry in entries:
        if name in (entry.exposed_name, f"{entry.server}/{entry.original_name}"):
            return entry
    matches = [e for e in entries if e.original_name == name]
    return matches[0] if len(matches) == 1 else None


def _claim(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise ValueError(f"--claim {item!r}: write ATTRIBUTE=VALUE, e.g. --claim tenant=acme")
    return name, value


def _claim_attributes(config_path: str | None) -> tuple[str, ...]:
    from bastion.policy.engine import load_claim_attributes

    return load_claim_attributes(Path(config_path)) if config_path else ()


def _policy_check(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from bastion.model import Identity, ToolEntry
    from bastion.policy.cedar_engine import PolicyLoadError
    from bastion.policy.dryrun import dry_run
    from bastion.policy.engine import tool_entries

    try:
        config, tools = _load(args.config)
        arguments = json.loads(args.args)
        if not isinstance(arguments, dict):
            raise ValueError("--args must be a JSON object")
        if args.tool_def:
            definition = json.loads(args.tool_def)
            entries = [ToolEntry(f"{args.server}__{definition.get('name', args.tool)}", args.server,
                                 str(definition.get("name", args.tool)), definition, args.trust)]
        else:
            entries = tool_entries(tools)
        entry = _find_tool(entries, args.tool)
        if entry is None:
            _say(f"error: tool {args.tool!r} is not defined; give --tool-def JSON or a tools list in the config")
            return EXIT_USAGE
        groups = tuple(args.group) if args.group is not None else (
            tuple(config.identity.groups) if config.identity.name == args.identity else ()
        )
        claims = dict(_claim(item) for item in args.claim)
        identity = Identity(args.identity, groups, args.authenticated_by, args.issuer, frozenset(args.scope), claims)
        report = dry_run(config, entry, identity, arguments, claim_attributes=_claim_attributes(args.config))
    except (OSError, ValueError, ValidationError, PolicyLoadError) as error:
        _say(f"error: {error}")
        return EXIT_USAGE
    _say(f"call: {entry.server}/{entry.original_name} as {args.identity} (groups: {', '.join(groups) or '-'})")
    _say(*report.lines())
    return report.exit_code


def _audit_verify(args: argparse.Namespace) -> int:
    from bastion.policy.approval import load_secret
    from bastion.policy.audit import verify_paths

    chosen = _trail_to_verify(args)
    if isinstance(chosen, str):
        _say(f"error: {chosen}")
        return EXIT_USAGE
    paths, key_file = chosen
    try:
        if key_file and not Path(key_file).expanduser().is_file():
            raise FileNotFoundError("no such file")  # load_secret would make a new key, which nothing was sealed with
        key = load_secret(key_file) if key_file else None
    except (OSError, ValueError) as error:
        _say(f"error: {key_file}: cannot use it as the audit key ({error}); give the audit.key_file the trail was written with")
        return EXIT_USAGE
    trail = verify_paths(paths, key)
    if args.json:
        sys.stdout.write(json.dumps(trail.to_json(), indent=2) + "\n")
    else:
        _say(*_audit_lines(trail))
    return 0 if trail.ok else 1


def _trail_to_verify(args: argparse.Namespace) -> tuple[list[str], str | None] | str:
    """The files to verify and the key file, as given; else the trail of --config, else the default trail (what
    the README verifies), said on stderr; or why there is none to verify."""
    from bastion.config import ConfigError, load_config
    from bastion.policy.config import AuditConfig

    if args.paths:
        return list(args.paths), args.key_file
    if args.config is None:
        trail, key_file, which = AuditConfig().path, args.key_file, "the default trail"
    else:
        try:
            config = load_config(Path(args.config), log_notes=False)
        except ConfigError as error:
            return str(error)
        if config.policy is None or not config.policy.audit.enabled:
            return f"{args.config} writes no audit trail (its policy or its audit is off)"
        audit = config.policy.audit
        trail, key_file, which = audit.path, args.key_file or audit.key_file, f"the trail of {args.config}"
    if not Path(trail).expanduser().exists():
        return (f"no audit trail at {trail} ({which}); give the policy.audit.path of the configuration whose "
                "trail to verify, or the configuration with --config")
    _say(f"{which}: {trail}")
    return [trail], key_file


def _audit_lines(trail: Any) -> list[str]:
    """The report for people: problems, notes, then one line per chain and, for several, the total."""
    lines = [f"TAMPERED: {problem}" for chain in trail.chains for problem in chain.report.problems]
    lines += [f"TAMPERED: {problem}" for problem in trail.problems]
    lines += [f"note: {chain.name}: {note}" if len(trail.chains) > 1 else f"note: {note}"
              for chain in trail.chains for note in chain.report.warnings]

    def status(ok: bool) -> str:
        return "intact" if ok else "NOT intact"

    missing = trail.discontinuities
    if missing:
        lines.append(f"{missing} {'discontinuity' if missing == 1 else 'discontinuities'} (the gap and discontinuity "
                     f"notes above): the trail itself records that records are missing there; that is not tampering")
    if len(trail.chains) == 1 and not trail.problems:
        report = trail.chains[0].report
        return lines + [f"{report.records} records in {len(report.files)} file(s), "
                        f"seq {report.first_seq}..{report.last_seq}: {status(report.ok)}"]
    for chain in trail.chains:
        report = chain.report
        if chain.chain is None:
            lines.append(f"registry {chain.name}: {report.records} chain(s) registered: {status(report.ok)}")
            continue
        label = "main chain" if chain.chain == 0 else f"chain {chain.chain}"
        lines.append(f"{label} {chain.name}: {report.records} records in {len(report.files)} file(s), "
                     f"seq {report.first_seq}..{report.last_seq}: {status(report.ok)}")
    audited = sum(1 for chain in trail.chains if chain.chain is not None)
    lines.append(f"all: {trail.records} records in {audited} chain(s): {status(trail.ok)}")
    return lines


@contextmanager
def _queue(args: argparse.Namespace) -> Iterator[Any]:
    """The queue of ``--queue-dir``, else of ``--config``: the shared state store's when its ``[state]`` names one
    (the replicas' queue), else its ``policy.approval.queue_dir``."""
    from bastion.cli.shared_state import shared_state
    from bastion.policy.approval import ApprovalQueue
    from bastion.policy.config import ApprovalConfig

    directory = args.queue_dir
    gateway = None
    if directory is None and args.config:
        from bastion.config import load_config

        config, _ = _load(args.config)
        directory = config.approval.queue_dir
        gateway = load_config(Path(args.config), log_notes=False)
    with shared_state(gateway) as shared:
        if shared is not None:
            from bastion.policy.approval_state import StateQueue

            yield StateQueue(*shared, config_file=args.config)
        else:
            yield ApprovalQueue(directory or ApprovalConfig().queue_dir)


def _approvals(args: argparse.Namespace) -> int:
    from bastion.state import StateUnavailable

    try:
        with _queue(args) as queue:
            pending = queue.pending()
    except StateUnavailable as error:
        _say(f"error: {error}")
        return 1
    if args.json:
        print(json.dumps([_listing(item) for item in pending], ensure_ascii=False, indent=2))
        return 0
    if not pending:
        _say("no calls are waiting for approval")
        return 0
    rows = [("ID", "WHO", "CALL", "LEFT", "ARGUMENTS")]
    for item in pending:
        record = item.record
        rows.append((item.id, _who(record), f"{record.get('server')}/{record.get('tool')}",
                     f"{int(item.seconds_left)}s", json.dumps(record.get("arguments"), ensure_ascii=False)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    for item in pending:  # what the session read before the call (guardrails.md, Cross-server taint)
        if item.record.get("note"):
            _say(f"{item.id}: {item.record['note']}")
    where = f" --config {args.config}" if args.config and args.queue_dir is None else ""
    _say(f"approve one with `bastion approve ID{where}`, refuse it with `bastion deny ID{where}`")
    return 0


def _who(record: dict[str, Any]) -> str:
    """The caller asking, as the approval prompt names it: ``alice (oauth, https://id.example.com)``."""
    who = record.get("who")
    if not isinstance(who, dict):
        return str(record.get("identity"))
    how = ", ".join(str(part) for part in (who.get("authenticated_by"), who.get("issuer")) if part)
    return f"{who.get('name')} ({how})" if how else str(who.get("name"))


def _listing(item: Any) -> dict[str, Any]:
    record = item.record
    return {
        "id": item.id,
        "status": item.status,
        "identity": record.get("identity"),
        "groups": record.get("groups", []),
        "who": record.get("who"),
        "server": record.get("server"),
        "tool": record.get("tool"),
        "method": record.get("method"),
        "arguments": record.get("arguments"),
        "note": record.get("note"),
        "created": record.get("created"),
        "expires": record.get("expires"),
        "seconds_left": round(item.seconds_left, 1),
        "pid": record.get("pid"),
        "replica": record.get("replica"),
    }


def _settle(args: argparse.Namespace, approve: bool) -> int:
    import getpass

    from bastion.state import StateUnavailable

    try:
        with _queue(args) as queue:
            item = queue.settle(args.id, approve, by=getpass.getuser())
    except StateUnavailable as error:
        _say(f"error: {error}; nothing was approved or denied")
        return 1
    except (LookupError, ValueError) as error:
        _say(f"error: {str(error).strip(chr(39))}")
        return 1
    _say(f"{item.id}: {item.status}")
    return 0


def _approve(args: argparse.Namespace) -> int:
    return _settle(args, True)


def _deny(args: argparse.Namespace) -> int:
    return _settle(args, False)
