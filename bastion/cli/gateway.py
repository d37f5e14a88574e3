"""``bastion run``, ``bastion check``, ``bastion tools`` and ``bastion call``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bastion.cli.conventions import LOG_FORMATS, add_global_flags, configure_logging, split_global_flags

if TYPE_CHECKING:  # each command imports what it uses when it runs: `bastion --help` needs none of it
    from bastion.config import GatewayConfig
    from bastion.gateway.core import Gateway
    from bastion.model import Session

log = logging.getLogger("bastion")


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="serve the federated servers to one MCP client on stdio")
    run.add_argument("config", nargs="?", help="configuration file (default: the built-in demo configuration)")
    add_log_format(run)
    _verbosity(run)
    run.set_defaults(handler=_run)

    check = sub.add_parser("check", help="validate a configuration without starting anything")
    check.add_argument("config", nargs="?")
    check.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    check.set_defaults(handler=_check)

    tools = sub.add_parser(
        "tools", help="the federated tool catalog as a table; `tools stats` token costs; `tools eval` search quality; "
        "`tools pin` pins the tool definitions",
        usage="bastion tools [CONFIG] [--json] [-v|-q] | bastion tools stats [CONFIG] ... | bastion tools eval --tools ... "
        "| bastion tools pin [CONFIG] [--output FILE]",
    )
    tools.add_argument("--json", action="store_true", help="print the catalog as JSON on stdout")
    tools.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    tools.set_defaults(handler=_tools_dispatch)

    call = sub.add_parser("call", help="call one tool through Bastion and print the result")
    call.add_argument("config", nargs="?")
    call.add_argument("name", help="the federated tool name, e.g. time__get_current_time")
    call.add_argument("--args", default="{}", help="the arguments as a JSON object")
    _verbosity(call)
    call.set_defaults(handler=_call)


def _verbosity(parser: argparse.ArgumentParser) -> None:
    add_global_flags(parser)


def add_log_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="human",
                        help="human (the default): a line a person reads; json: one JSON object a line, with the "
                             "request id, trace id, identity, server and tool of the request it was written during")


def setup_logging(args: argparse.Namespace) -> None:
    """Logging as -v/-q given after the subcommand and --log-format say; without them, as ``bastion`` set it up
    from its own."""
    verbose, quiet = getattr(args, "verbose", False), getattr(args, "quiet", False)
    log_format = getattr(args, "log_format", "human")
    if verbose or quiet or log_format != "human":
        configure_logging(verbose, quiet, log_format)


def json_logs(args: argparse.Namespace) -> bool:
    """Whether log lines are JSON, and so carry each request's facts (the gateway keeps them only then)."""
    return getattr(args, "log_format", "human") == "json"


def _load(args: argparse.Namespace) -> GatewayConfig | None:
    from bastion.config import ConfigError, load_config

    try:
        return load_config(args.config)
    except ConfigError as exc:
        print(f"bastion: {exc}", file=sys.stderr)
        return None


def _run(args: argparse.Namespace) -> int:
    from bastion.compose import build_gateway
    from bastion.frontends.stdio import serve_stdio
    from bastion.transport.stdio import protect_stdout

    protocol_fd = protect_stdout()
    setup_logging(args)
    config = _load(args)
    if config is None:
        return 2
    log.info("serving %d server(s) on stdio: %s", len(config.servers), ", ".join(config.servers) or "none")
    gateway = build_gateway(config, log_context=json_logs(args))
    # What is loaded by now (modules, configuration, policy) lives as long as the process: left in the collected
    # generations, every full collection would walk it again while requests wait.
    gc.freeze()
    try:
        stopped_by = run_loop(with_status_board(gateway, with_operations_listener(
            gateway, serve_stdio(gateway, protocol_fd, gateway.identity))))
    except OSError as exc:
        print(f"bastion: cannot listen on {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if stopped_by == signal.SIGINT:
        raise KeyboardInterrupt  # the servers are stopped by now; said and exited like Ctrl-C anywhere else
    return 0


def with_operations_listener(gateway: Any, serving) -> Any:
    """``serving`` with the ``[metrics] listen`` listener beside it when one is configured (its modules are loaded
    only then)."""
    if gateway.metrics is None or gateway.metrics.config.listen is None:
        return serving
    from bastion.frontends.http.operations import with_metrics_listener

    return with_metrics_listener(gateway, serving)


async def with_status_board(gateway: Any, serving) -> Any:
    """``serving`` with the status file `bastion servers` reads kept up to date (a reload's new servers too), its
    retries taken, and the configuration reloaded on SIGHUP or a change of its files."""
    from bastion.running import StatusBoard

    source = gateway.config.source
    board = StatusBoard(gateway.upstreams, str(source) if source is not None else None, catalog=gateway.catalog)
    board.start()
    gateway.reloader.listeners.append(board.follow)
    try:
        return await with_reloading(gateway, serving)
    finally:
        await board.close()


async def with_reloading(gateway: Any, serving) -> Any:
    """``serving`` with SIGHUP reloading the configuration, and (``reload.watch``) its files watched."""
    from bastion.reload import FileWatch, watched_files

    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[Any]] = set()

    def reload(cause: str) -> asyncio.Task[Any]:
        task = loop.create_task(gateway.reload(cause=cause))
        reloads.add(task)
        task.add_done_callback(reloads.discard)
        return task

    watch = None
    settings = gateway.config.reload
    if settings.watch and gateway.config.source is not None:
        files = FileWatch(lambda: watched_files(gateway.config), settings.interval, gateway.reloader,
                          lambda: reload("the file watch"))
        watch = loop.create_task(files.run(), name="reload:watch")
    try:
        loop.add_signal_handler(signal.SIGHUP, reload, "SIGHUP")
    except (NotImplementedError, RuntimeError):  # not the main thread: no reload by signal
        pass
    try:
        return await serving
    finally:
        try:
            loop.remove_signal_handler(signal.SIGHUP)
            # Ignored while the gateway closes, not back to its default (which ends the process mid-shutdown).
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        for task in (*reloads, *((watch,) if watch is not None else ())):
            task.cancel()
        await asyncio.gather(*reloads, *((watch,) if watch is not None else ()), return_exceptions=True)


def run_loop(coroutine) -> Any:
    """Run on uvloop where it is installed: its pipes and callbacks cost a fraction of the stock loop's. Tasks start
    eagerly where the running Python can (3.12+): a request's Task runs up to its first wait in the turn that read
    it, instead of one turn later."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_with_eager_tasks(coroutine))
    return uvloop.run(_with_eager_tasks(coroutine))


async def _with_eager_tasks(coroutine) -> Any:
    factory = getattr(asyncio, "eager_task_factory", None)
    if factory is not None:
        asyncio.get_running_loop().set_task_factory(factory)
    return await coroutine


def _check(args: argparse.Namespace) -> int:
    """Validate a configuration and report what would fail at run time; 0 when usable (warnings allowed), 2 not."""
    from bastion.config import ConfigError, load_config
    from bastion.diagnostics import diagnose
    from bastion.finding import Finding

    source = str(Path(args.config).resolve()) if args.config else None
    try:
        config = load_config(args.config, log_notes=False)
    except ConfigError as exc:
        if args.json:
            findings = list(exc.findings) or [Finding("error", "(file)", str(exc), "see the message")]
            _print_check_report(source, {}, findings, None)
        else:
            print(f"bastion: {exc}", file=sys.stderr)
        return 2
    findings = diagnose(config)
    policy_summary = None
    if config.policy is not None:
        from bastion.policy.config import PolicyStartError
        from bastion.policy.engine import PolicyEngine

        try:
            engine = PolicyEngine(config.policy)  # parses and validates the Cedar policies, reads the pins
        except PolicyStartError as exc:
            findings.append(Finding("error", "policy", f"the policy does not load: {exc}",
                                    "fix the file named in the message (docs/policy.md)"))
        else:
            files = ", ".join(str(p) for p in config.policy.policy_paths()) or "the default policy"
            policy_summary = f"{files}; {len(engine.guards)} guard(s)"
    ok = not any(f.level == "error" for f in findings)
    if args.json:
        _print_check_report(source, config.servers, findings, "off" if config.policy is None else policy_summary, ok)
        return 0 if ok else 2
    for name, server in config.servers.items():
        state = "" if server.enabled else " (disabled)"
        target = f"{server.url} (remote{_key_pins(server)})" if server.url is not None \
            else f"{server.command} {' '.join(server.args)}"
        print(f"{name}: {target}{state}", file=sys.stderr)
    if config.policy is None:
        print("policy: off (every call is allowed, nothing is audited)", file=sys.stderr)
    elif policy_summary:
        print(f"policy: {policy_summary}", file=sys.stderr)
    for finding in findings:
        print(f"{finding.level}: {finding.where}: {finding.message} — fix: {finding.fix}", file=sys.stderr)
    errors = sum(f.level == "error" for f in findings)
    warnings = len(findings) - errors
    if ok:
        tail = f", {warnings} warning(s)" if warnings else ""
        print(f"bastion: configuration OK, {len(config.servers)} server(s){tail}", file=sys.stderr)
    else:
        print(f"bastion: {errors} error(s), {warnings} warning(s) in the configuration", file=sys.stderr)
    return 0 if ok else 2


def _key_pins(server: Any) -> str:
    """A remote server's public-key pin status, as `bastion check` shows it."""
    if server.pinned_public_keys:
        return f"; public key pinned: {', '.join(server.pinned_public_keys)}"
    if server.url.lower().startswith("https://"):
        return "; public key not pinned: any certificate the trust store accepts"
    return ""


def _print_check_report(source: str | None, servers: dict, findings: list, policy: str | None, ok: bool = False) -> None:
    import orjson

    report = {
        "file": source,
        # Variable names only: values may be secrets, and a report is made to be pasted.
        "servers": {name: {"command": s.command, "args": list(s.args), "cwd": s.cwd, "env": sorted(s.env),
                           "enabled": s.enabled, "auto_approve": list(s.auto_approve),
                           **({"url": s.url, "headers": sorted(s.headers),
                               "pinned_public_keys": list(s.pinned_public_keys)} if s.url is not None else {})}
                    for name, s in servers.items()},
        "policy": policy,
        "findings": [f.as_dict() for f in findings],
        "ok": ok,
    }
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")


async def with_gateway(config: GatewayConfig, work) -> Any:
    """Start the servers, wait for every one (up to its own startup_timeout: a one-shot command has no
    list_changed to take a late server in), run ``work(gateway, session)``, shut down."""
    from bastion.compose import build_gateway
    from bastion.model import Session

    gateway = build_gateway(config)
    session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "cli", finds_tools_itself=True)
    try:
        gateway.start({})
        await gateway.wait_started()
        return await work(gateway, session)
    finally:
        await gateway.close()


def _tools_dispatch(args: argparse.Namespace) -> int:
    # `bastion tools` parses its own arguments (a CONFIG or a further subcommand first): -v/-q anywhere in them
    # are the global flags, for every form.
    rest, flags = split_global_flags(list(args.rest))
    if flags:
        configure_logging(flags.get("verbose", False), flags.get("quiet", False))
    json_output = getattr(args, "json", False)
    if json_output and rest[:1] in (["eval"], ["stats"]):
        rest.append("--json")
    if rest and rest[0] == "eval":
        from bastion.search.cli import eval_main

        return eval_main(rest[1:])
    if rest and rest[0] == "pin":
        return _pin(rest[1:])
    if rest and rest[0] == "stats":
        from bastion.search.cli import stats_main

        return stats_main(rest[1:], _live_catalog)
    parser = argparse.ArgumentParser(prog="bastion tools")
    parser.add_argument("config", nargs="?")
    parser.add_argument("--json", action="store_true", help="print the catalog as JSON on stdout")
    tools_args = parser.parse_args(rest)
    tools_args.json = tools_args.json or json_output
    return _tools(tools_args)


def _pin(argv: list[str]) -> int:
    from bastion.policy.pins import pins_of, write_pins

    parser = argparse.ArgumentParser(
        prog="bastion tools pin",
        description="record the live tool definitions as the pinned ones (policy.pins, unless --output)",
    )
    parser.add_argument("config", nargs="?")
    parser.add_argument("--output", help="where to write the pins (default: the configuration's policy.pins)")
    _verbosity(parser)
    args = parser.parse_args(argv)
    setup_logging(args)
    config = _load(args)
    if config is None:
        return 2
    configured = config.policy.pins_path() if config.policy is not None else None
    target = Path(args.output) if args.output else configured
    if target is None:
        print("bastion: no pins file: set policy.pins in the configuration, or give --output FILE", file=sys.stderr)
        return 2
    # Starting the gateway reads the pins it is about to replace; a file still to be written is no error here.
    config = config.model_copy(update={"policy": config.policy.model_copy(update={"pins": None})}) if configured else config

    async def work(gateway: Gateway, session: Session) -> int:
        entries = list(gateway.catalog.tools())
        down = [n for n, u in gateway.upstreams.items() if not u.ready.is_set()]
        if down:
            print(f"bastion: not pinned: {', '.join(down)} did not start; pins are written from every server",
                  file=sys.stderr)
            return 1
        write_pins(target, pins_of(entries))
        print(f"bastion: pinned {len(entries)} tool(s) from {len(gateway.upstreams)} server(s) in {target}",
              file=sys.stderr)
        return 0

    return run_loop(with_gateway(config, work))


def _live_catalog(config_path: str | None) -> dict[str, list[dict[str, Any]]]:
    """The federated catalog, per server, under the names clients see (for ``bastion tools stats``)."""
    from bastion.config import load_config

    config = load_config(config_path)

    async def work(gateway: Gateway, session: Session) -> dict[str, list[dict[str, Any]]]:
        catalog: dict[str, list[dict[str, Any]]] = {name: [] for name in gateway.upstreams}
        for entry in gateway.catalog.tools():
            catalog[entry.server].append(dict(entry.definition))
        return catalog

    return run_loop(with_gateway(config, work))


def _tools(args: argparse.Namespace) -> int:
    import orjson

    from bastion.model import GatewayRequest

    setup_logging(args)
    config = _load(args)
    if config is None:
        return 2

    async def work(gateway: Gateway, session: Session) -> int:
        # The permitted catalog, whatever the exposure mode (which is for MCP clients: past 10 tools, "auto" would show
        # a person two meta-tools); the last line says what clients are shown.
        result = await gateway.handle(GatewayRequest("tools/list", {}, session, gateway.catalog))
        down = [n for n, u in gateway.upstreams.items() if not u.ready.is_set()]
        if args.json:
            sys.stdout.write(orjson.dumps(_catalog_report(gateway, result["tools"]), option=orjson.OPT_INDENT_2).decode()
                             + "\n")
            return 0 if not down else 1
        rows = []
        for tool in result["tools"]:
            entry = gateway.catalog.tool(tool["name"])
            description = " ".join((tool.get("description") or "").split())
            rows.append((tool["name"], entry.server if entry else "?", description[:80]))
        width = max((len(r[0]) for r in rows), default=4)
        swidth = max((len(r[1]) for r in rows), default=6)
        print(f"{'TOOL'.ljust(width)}  {'SERVER'.ljust(swidth)}  DESCRIPTION")
        for name, server, description in rows:
            print(f"{name.ljust(width)}  {server.ljust(swidth)}  {description}")
        print(f"{len(rows)} tool(s) from {len(gateway.upstreams) - len(down)} server(s)"
              + (f"; not available: {', '.join(down)}" if down else ""), file=sys.stderr)
        from bastion.search.auto import shown_to_clients

        definitions = [entry.definition for entry in gateway.catalog.tools()]
        print(shown_to_clients(gateway.config.tools.exposure, definitions), file=sys.stderr)
        return 0 if not down else 1

    return run_loop(with_gateway(config, work))


def _catalog_report(gateway: Gateway, listed: list[dict[str, Any]]) -> dict[str, Any]:
    """``bastion tools --json``: the tools a client is listed, each with its server, and every server's state."""
    tools = []
    for definition in listed:
        entry = gateway.catalog.tool(definition["name"])
        tools.append({"name": definition["name"], "server": entry.server if entry else None,
                      "original_name": entry.original_name if entry else None, "definition": definition})
    servers = {name: {"available": upstream.ready.is_set(), "failure": getattr(upstream, "failure", None)}
               for name, upstream in gateway.upstreams.items()}
    return {"tools": tools, "servers": servers}


def _call(args: argparse.Namespace) -> int:
    import orjson

    from bastion.model import GatewayError, GatewayRequest

    setup_logging(args)
    try:
        arguments = orjson.loads(args.args)
    except orjson.JSONDecodeError as exc:
        print(f"bastion: --args is not valid JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(arguments, dict):
        print("bastion: --args must be a JSON object", file=sys.stderr)
        return 2
    config = _load(args)
    if config is None:
        return 2

    async def work(gateway: Gateway, session: Session) -> int:
        request = GatewayRequest("tools/call", {"name": args.name, "arguments": arguments}, session, gateway.catalog,
                                 request_id="cli-call")
        try:
            result = _decoded(await gateway.handle(request))
        except GatewayError as exc:
            print(f"bastion: error {exc.code}: {exc.message}", file=sys.stderr)
            return 1
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 1 if result.get("isError") else 0

    return run_loop(with_gateway(config, work))


def _decoded(result: Any) -> dict[str, Any]:
    """A tools/call result as a dict: where nothing in the chain reads results, it comes as the server's bytes."""
    from bastion.model import GatewayError
    from bastion.protocol.jsonrpc import ErrorResponse, RawResponse

    if type(result) is not RawResponse:
        return result
    decoded = result.decoded()
    if type(decoded) is ErrorResponse:
        raise GatewayError.from_error(decoded.error)
    return decoded.result
