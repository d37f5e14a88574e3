"""``bastion guard check FILE``: the guardrails' dry run, as ``bastion policy check`` is the policy's.

The file holds what a server would send: a tool definition, a ``tools/list`` (or prompts, resources, templates)
result, a tool result, a ``resources/read`` or ``prompts/get`` result, an error, or a ``sampling/createMessage``
request; a JSON-RPC message around any of them is unwrapped. It is passed through the very guardrail chain the
gateway builds from the configuration, around the gateway's own catalog, with a terminal that answers from the
file instead of a server: no server is started or contacted. The pins file is read but never written (the run
works on a copy), so a definition that differs from its pin is reported as withheld, and a new one as first seen.

What each guardrail did goes to stderr, one line each; ``--json`` prints the report (the interventions, the
refusal if any, and what the client would be given) on stdout. Exit status: 0 the content passes unchanged,
3 a guardrail intervened (withheld, redacted, marked, capped or refused), 2 the input or configuration is bad.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_PASSES = 0
EXIT_USAGE = 2
EXIT_INTERVENED = 3

# Where each list's items live in the catalog, and the key of the list in a result.
_LISTS = {"tools/list": ("tools", "tools"), "prompts/list": ("prompts", "prompts"),
          "resources/list": ("resources", "resources"),
          "resources/templates/list": ("resourceTemplates", "resourceTemplates")}
_SERVER_TO_CLIENT = frozenset({"sampling/createMessage", "elicitation/create"})
_METHODS = (*_LISTS, "tools/call", "resources/read", "prompts/get", *sorted(_SERVER_TO_CLIENT))
_SAMPLING_ANSWER = {"role": "assistant", "content": {"type": "text", "text": ""}, "model": "dry-run"}


class InputError(ValueError):
    """The file cannot be checked; the message names the file and what to give instead."""


def _say(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def register(subparsers: Any) -> None:
    guard = subparsers.add_parser("guard", help="guardrail tools")
    guard_sub = guard.add_subparsers(dest="guard_command", required=True)
    check = guard_sub.add_parser(
        "check", help="run the guardrails on a tool definition, a list, a result or a sampling request in a JSON "
                      "file, without contacting any server (exit 0 passes unchanged, 3 a guardrail intervened)")
    check.add_argument("file", help="JSON file (- for stdin): a tool definition, a tools/list result, a tool result, "
                                    "a resources/read or prompts/get result, an error, or a sampling request")
    check.add_argument("--config", help="Bastion configuration whose [guardrails] and servers to use "
                                        "(default: the defaults, every guardrail on)")
    check.add_argument("--server", default="server",
                       help="the server the content comes from (default: server); its trust comes from --config")
    check.add_argument("--trust", choices=["trusted", "reviewed", "untrusted"],
                       help="the server's trust level (default: from --config, else untrusted)")
    check.add_argument("--name", default="tool",
                       help="the tool or prompt (as the server names it) a result answers (default: tool)")
    check.add_argument("--tool-def", help="that tool's definition as JSON (default: a tool with no parameters)")
    check.add_argument("--as", dest="method", choices=_METHODS,
                       help="what the file is, when its shape does not say (e.g. prompts/get)")
    check.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    check.set_defaults(handler=_guard_check)


# --------------------------------------------------------------------------------------------- the input
@dataclass
class Subject:
    """What the file holds, as one message through the chain."""

    method: str
    params: dict[str, Any]
    listed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # catalog kind -> the server's items
    result: Any = None  # what the server answers (None for a list: the catalog answers those)
    error: dict[str, Any] | None = None  # the server's error, when it answers with one

    def describe(self) -> str:
        for kind, items in self.listed.items():
            if self.method in _LISTS:
                return f"{self.method} ({len(items)} {kind if len(items) != 1 else kind[:-1]})"
        return self.method + (" (an error)" if self.error is not None else "")


def read_document(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read it: {error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not JSON ({error}); give the JSON a server would send") from None


def classify(document: Any, where: str, method: str | None, name: str) -> Subject:
    """The message ``document`` is; ``method`` (from --as) overrides what its shape says."""
    if isinstance(document, dict) and "jsonrpc" in document:
        if isinstance(document.get("error"), dict):
            return Subject(method or "tools/call", {"name": name}, error=document["error"])
        if "method" in document:
            method = method or str(document["method"])
            document = document.get("params") or {}
        elif "result" in document:
            document = document["result"]
    if not isinstance(document, dict):
        raise InputError(f"{where}: the top level is {type(document).__name__}, not a JSON object; give a tool "
                         "definition, a result or a request's params")
    method = method or _shape(document, where)
    if method in _LISTS:
        kind, key = _LISTS[method]
        items = [document] if key not in document else document[key]
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise InputError(f"{where}: {key!r} must be a list of objects")
        return Subject(method, {}, listed={kind: items})
    if method == "tools/call":
        return Subject(method, {"name": name, "arguments": {}}, result=document)
    if method == "prompts/get":
        return Subject(method, {"name": name, "arguments": {}}, result=document)
    if method == "resources/read":
        contents = document.get("contents")
        first = contents[0] if isinstance(contents, list) and contents and isinstance(contents[0], dict) else {}
        uri = first.get("uri") if isinstance(first.get("uri"), str) else "resource://dry-run"
        return Subject(method, {"uri": uri}, listed={"resources": [{"uri": uri, "name": "resource"}]}, result=document)
    return Subject(method, document)  # a server's request toward the client: the file is its params


def _shape(document: dict[str, Any], where: str) -> str:
    if "error" in document and isinstance(document["error"], dict):
        raise InputError(f"{where}: an error without its JSON-RPC envelope; give the whole error response "
                         '({"jsonrpc": "2.0", "id": 1, "error": {...}})')
    for method, (_, key) in _LISTS.items():
        if key in document:
            return method
    if isinstance(document.get("name"), str) and "inputSchema" in document:
        return "tools/list"
    if isinstance(document.get("content"), list) or "structuredContent" in document:
        return "tools/call"
    if isinstance(document.get("contents"), list):
        return "resources/read"
    if isinstance(document.get("messages"), list):
        return "sampling/createMessage" if "maxTokens" in document else "prompts/get"
    raise InputError(f"{where}: cannot tell what this is; give a tool definition (name, inputSchema), a result "
                     "(content, contents or messages), a list (tools, prompts, resources) or use --as METHOD")


# ------------------------------------------------------------------------------------------------ the run
@dataclass
class Report:
    subject: Subject
    server: str
    trust: str
    interventions: list[dict[str, Any]]
    refused: dict[str, Any] | None
    given: Any  # what the client would get: the result, or the server's request as forwarded

    @property
    def exit_code(self) -> int:
        return EXIT_INTERVENED if self.interventions or self.refused is not None else EXIT_PASSES

    def lines(self) -> list[str]:
        out = [f"checked: {self.subject.describe()} from server {self.server!r} ({self.trust})"]
        for each in self.interventions:
            target = f" {each['target']}" if each.get("target") else ""
            detail = f": {each['detail']}" if each.get("detail") else ""
            out.append(f"  {each['guardrail']}: {each['action']}{target} — {each['found']} (rule {each['rule']}){detail}")
        if self.refused is not None:
            out.append(f"refused: {self.refused.get('message', '')}")
        elif self.subject.method in _LISTS:
            kind, key = _LISTS[self.subject.method]
            offered = len(self.subject.listed.get(kind, []))
            out.append(f"served: {len((self.given or {}).get(key, []))} of {offered}")
        out.append("passes unchanged" if self.exit_code == EXIT_PASSES else "a guardrail intervened")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"method": self.subject.method, "server": self.server, "trust": self.trust,
                "interventions": self.interventions, "refused": self.refused, "given": self.given,
                "passes": self.exit_code == EXIT_PASSES}


def dry_run(subject: Subject, guardrails: Any, server: str, prefix: str, trust: str,
            tool_definition: dict[str, Any] | None, name: str, identity: str | None = None) -> Report:
    """``subject`` through the guardrail chain ``guardrails`` builds, as the gateway would pass it."""
    from bastion.gateway.catalog import Catalog, ServerFacts
    from bastion.gateway.pipeline import build_pipeline
    from bastion.guardrails.chain import build_guardrails
    from bastion.guardrails.report import InterventionLog
    from bastion.model import CallInFlight, GatewayError, GatewayRequest, Identity, Session

    catalog = Catalog([ServerFacts(server, prefix, trust)])
    for kind, items in subject.listed.items():
        catalog.update(server, kind, copy.deepcopy(items))
    if subject.method == "tools/call":
        catalog.update(server, "tools", [tool_definition or {"name": name, "inputSchema": {"type": "object"}}])
    elif subject.method == "prompts/get":
        catalog.update(server, "prompts", [{"name": name}])
    params = dict(subject.params)
    if "name" in params:  # the client calls the tool or prompt by the name the catalog gives it
        exposed = _exposed(catalog, subject.method, server, name)
        params["name"] = exposed if exposed is not None else name
    interventions: list[dict[str, Any]] = []
    chain = build_guardrails(guardrails, InterventionLog(interventions.append), catalog,
                             identities={server: identity} if identity is not None else None).all()
    toward_client = subject.method in _SERVER_TO_CLIENT
    if toward_client:  # the gateway passes a server's request only through the interceptors that name its method
        chain = [each for each in chain if subject.method in (getattr(each, "methods", None) or ())]
    forwarded: list[dict[str, Any]] = []

    async def terminal(request: GatewayRequest) -> dict[str, Any]:
        forwarded.append(request.params)
        if subject.method in _LISTS:
            kind, key = _LISTS[subject.method]
            return {key: catalog.listing(kind)}
        if subject.error is not None:
            raise GatewayError.from_error(subject.error)
        if toward_client:
            return dict(_SAMPLING_ANSWER) if subject.method == "sampling/createMessage" else {"action": "decline"}
        return copy.deepcopy(subject.result)

    session = Session(Identity("dry-run"), "legacy", "2025-11-25",
                      {"sampling": {}, "elicitation": {}, "roots": {}}, {"name": "bastion guard check"}, "dry-run")
    request = GatewayRequest(subject.method, params, session, catalog, request_id=1,
                             server=server if toward_client else None,
                             calls_in_flight=(CallInFlight("tools/call", 0),) if toward_client else ())
    refused: dict[str, Any] | None = None
    given: Any = None
    with _quiet(logging.getLogger("bastion.guardrails")):
        try:
            answer = asyncio.run(build_pipeline(chain, terminal)(request))
            given = forwarded[-1] if toward_client and forwarded else answer
        except GatewayError as error:
            refused = error.to_error()
            if subject.error is not None and refused == subject.error and not interventions:
                refused, given = None, {"error": subject.error}  # the server's own error, passed on unchanged
    return Report(subject, server, trust, interventions, refused, given)


def _exposed(catalog: Any, method: str, server: str, name: str) -> str | None:
    if method == "prompts/get":
        for item in catalog.listing("prompts"):
            named = catalog.prompt(item["name"])
            if named is not None and named.server == server and named.original == name:
                return item["name"]
        return None
    for entry in catalog.tools():
        if entry.server == server and entry.original_name == name:
            return entry.exposed_name
    return None


class _quiet:
    """Holds back a logger's records while the report says the same in its own lines."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def __enter__(self) -> None:
        self._logger.addFilter(_drop)

    def __exit__(self, *_: object) -> None:
        self._logger.removeFilter(_drop)


def _drop(_record: logging.LogRecord) -> bool:
    return False


# ---------------------------------------------------------------------------------------------- the command
def _guard_check(args: argparse.Namespace) -> int:
    from bastion.config import ConfigError, load_config
    from bastion.guardrails.config import GuardrailsConfig

    try:
        # Without --config, the defaults: every guardrail on, and no server configured.
        config = load_config(args.config, log_notes=False) if args.config else None
        subject = classify(read_document(args.file), args.file, args.method, args.name)
        tool_definition = json.loads(args.tool_def) if args.tool_def else None
        if tool_definition is not None and not isinstance(tool_definition, dict):
            raise InputError("--tool-def must be a JSON object (a Tool definition)")
    except (ConfigError, InputError) as error:
        _say(f"error: {error}")
        return EXIT_USAGE
    except json.JSONDecodeError as error:
        _say(f"error: --tool-def is not JSON ({error})")
        return EXIT_USAGE
    guardrails = GuardrailsConfig() if config is None else config.guardrails
    if guardrails is None:
        if args.json:
            sys.stdout.write(json.dumps({"method": subject.method, "server": args.server, "guardrails": "off",
                                         "interventions": [], "refused": None, "passes": True}, indent=2) + "\n")
        _say(f"note: guardrails are off in {args.config}: nothing would be checked")
        return EXIT_PASSES
    configured = config.servers.get(args.server) if config is not None else None
    trust = args.trust or (configured.trust if configured is not None else "untrusted")
    prefix = configured.prefix if configured is not None and configured.prefix is not None else args.server
    identity = _identity(config, args.server)
    with tempfile.TemporaryDirectory(prefix="bastion-guard-check-") as scratch:
        scratched = _with_scratch_pins(guardrails, Path(scratch))
        if identity is not None:  # pins kept by name alone are this server's as the gateway would take them
            from bastion.guardrails.pin_store import PinStore
            from bastion.guardrails.pinning import claim_pins
            from bastion.server_entry import pinned_entry

            claim_pins(PinStore(scratched.pins_path()), {args.server: pinned_entry(configured)},
                       {args.server: identity})
        report = dry_run(subject, scratched, args.server, prefix, trust, tool_definition, args.name, identity)
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
    _say(*report.lines())
    return report.exit_code


def _identity(config: Any, server: str) -> str | None:
    """The identity the gateway pins ``server`` under, when it is a server of ``config``'s file (else by name)."""
    from bastion.guardrails.pin_book import server_id

    if config is None or config.source is None or server not in config.servers:
        return None
    return server_id(server, str(config.source))


def _with_scratch_pins(guardrails: Any, scratch: Path) -> Any:
    """``guardrails`` with its pins file copied into ``scratch``: read as it is, never written by a dry run."""
    pins = guardrails.pins_path()
    copied = scratch / "pins.json"
    if pins.is_file():
        shutil.copyfile(pins, copied)
    return guardrails.model_copy(update={"pins": guardrails.pins.model_copy(update={"path": str(copied)})})
