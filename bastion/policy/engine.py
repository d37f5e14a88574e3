"""The decision pipeline for one call, without I/O: authorization, input schema, argument guards.

Both the gateway's interceptors and ``bastion policy check`` use it, so a dry run decides exactly as the
running gateway would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, Sequence, TypeVar

from bastion.model import Identity, ToolEntry
from bastion.policy.cedar_engine import CedarAuthorizer, SessionFacts, Target, ToolFacts
from bastion.policy.config import (
    GuardConfig,
    PathGuardConfig,
    PolicyConfig,
    SchemaGuardConfig,
    ShellGuardConfig,
    UrlGuardConfig,
)
from bastion.policy.decision import Decision, Effect, GuardResult
from bastion.policy.guards import PathRules, SchemaCache, ShellRules, UrlRules, check_path, check_schema
from bastion.policy.guards import check_shell_argument, check_url
from bastion.policy.guards.schema import DeclaredKeys, check_compiled, check_declared, declared_keys
from bastion.policy.pins import PinnedTools, read_pins

_MISSING = object()
_T = TypeVar("_T")
SCHEMA_RULE = "schema:inputSchema"
UNDECLARED_RULE = "undeclared_arguments"
# Decisions are frozen; the one for accepted arguments is the same every time.
_ARGUMENTS_ACCEPTED = Decision.allow("guards", "arguments accepted")


def _pointer_values(arguments: Any, where: str) -> Iterator[Any]:
    """The value(s) at ``where`` (an argument name or a JSON Pointer); lists yield each element."""
    if where.startswith("/"):
        node: Any = arguments
        for raw in where[1:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping):
                node = node.get(part, _MISSING)
            elif isinstance(node, list) and part.isascii() and part.isdigit() and len(part) < 19 \
                    and int(part) < len(node):
                node = node[int(part)]
            else:
                node = _MISSING
            if node is _MISSING:
                return
    else:
        node = arguments.get(where, _MISSING) if type(arguments) is dict else _MISSING
        if node is _MISSING:
            return
    if type(node) is list:
        yield from node
    else:
        yield node


@dataclass(frozen=True, slots=True)
class CompiledGuard:
    rule: str
    tool: str
    argument: str
    check: Callable[[Any], GuardResult]

    def applies_to(self, entry: ToolEntry) -> bool:
        return fnmatchcase(f"{entry.server}/{entry.original_name}", self.tool) or fnmatchcase(
            entry.exposed_name, self.tool
        )


def _bound(check: Callable[[Any, Any], GuardResult], rules: Any) -> Callable[[Any], GuardResult]:
    """``check`` with its rules bound. A closure: a partial with keyword arguments costs three times more
    per call, and guards run on every call."""
    return lambda value: check(value, rules)


def compile_guard(config: GuardConfig, schemas: SchemaCache) -> CompiledGuard:
    rule = config.rule or f"{config.kind}:{config.tool}:{config.argument}"
    check: Callable[[Any], GuardResult]
    if isinstance(config, PathGuardConfig):
        path_rules = PathRules.build(
            config.roots, config.base, config.resolve_symlinks, config.allow_hidden, config.allow_backslash,
            allow_percent=config.allow_percent, allow_lookalikes=config.allow_lookalikes,
        )
        check = _bound(check_path, path_rules)
    elif isinstance(config, ShellGuardConfig):
        shell_rules = ShellRules(config.mode, config.positional, config.allow_whitespace, tuple(config.allowed_commands))
        check = _bound(check_shell_argument, shell_rules)
    elif isinstance(config, UrlGuardConfig):
        url_rules = UrlRules(
            tuple(config.schemes),
            tuple(config.allow_hosts),
            tuple(config.deny_hosts),
            config.allow_private,
            config.allow_userinfo,
            tuple(config.allowed_ports),
        )
        check = _bound(check_url, url_rules)
    elif isinstance(config, SchemaGuardConfig):
        extra = config.json_schema
        schemas.validator(extra)  # compile now so a broken schema fails at start
        check = lambda value: check_schema(value, extra, schemas)  # noqa: E731
    else:  # pragma: no cover - the discriminated union admits nothing else
        raise TypeError(f"unknown guard kind {config!r}")
    return CompiledGuard(rule, config.tool, config.argument, check)


class _PerEntry(Generic[_T]):
    """Values worked out once per catalog entry, bounded.

    The catalog hands out the same entry object on every call, and a changed definition is a new entry, so
    the entry's identity is the key (checked against the entry itself, since ids are reused).
    """

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[ToolEntry, _T]] = {}

    def find(self, entry: ToolEntry) -> _T | None:
        known = self._by_id.get(id(entry))
        return known[1] if known is not None and known[0] is entry else None

    def keep(self, entry: ToolEntry, value: _T) -> _T:
        if len(self._by_id) > 4096:
            self._by_id.clear()
        self._by_id[id(entry)] = (entry, value)
        return value


@dataclass(frozen=True, slots=True)
class _ArgumentPlan:
    validator: Any  # compiled input schema, a ValueError when it cannot compile, None: not checked
    guards: tuple[tuple[str, bool, Callable[[Any], GuardResult], str], ...]  # (argument, is a pointer, check, rule)
    declared: DeclaredKeys | None = None  # the argument names the input schema declares; None: not checked


@dataclass(slots=True)
class CallReport:
    """Every stage's decision for one call, and the overall outcome."""

    stages: list[tuple[str, Decision]] = field(default_factory=list)

    @property
    def decision(self) -> Decision:
        approval = None
        for _, decision in self.stages:
            if decision.effect is Effect.DENY:
                return decision
            if decision.effect is Effect.APPROVAL:
                approval = decision
        return approval or (self.stages[0][1] if self.stages else Decision.allow())


class PolicyEngine:
    """Authorization plus guards for a ``PolicyConfig``; built once at start, then pure per call."""

    def __init__(
        self,
        config: PolicyConfig,
        authorizer: CedarAuthorizer | None = None,
        pinned: Callable[[ToolEntry], bool] | None = None,
        claim_attributes: Iterable[str] = (),
    ) -> None:
        """``claim_attributes``: the principal attributes ``auth.claims.attributes`` names, which policies may read."""
        self.config = config
        self.authorizer = authorizer or CedarAuthorizer.from_files(
            config.policy_paths(), include_default=config.include_default_policy, claim_attributes=claim_attributes
        )
        self.schemas = SchemaCache()
        self.guards: tuple[CompiledGuard, ...] = tuple(compile_guard(g, self.schemas) for g in config.guards)
        self._pinned = pinned or _pins_from(config)
        self._argument_plans: _PerEntry[_ArgumentPlan] = _PerEntry()
        self._targets: _PerEntry[Target] = _PerEntry()
        self._call_decisions: dict[tuple[int, int, int], tuple[Identity, ToolEntry, SessionFacts | None, Decision]] = {}

    def tool_target(self, entry: ToolEntry) -> Target:
        target = self._targets.find(entry)
        if target is None:
            target = self._targets.keep(entry, Target.for_tool(ToolFacts.of(entry, self._pinned(entry))))
        return target

    def authorize_call(
        self, identity: Identity, entry: ToolEntry, arguments: Mapping[str, Any] | None, session: SessionFacts | None
    ) -> Decision:
        if self.authorizer.reads_arguments:
            return self.authorizer.authorize(identity, "call_tool", self.tool_target(entry), arguments, session)
        # Identity, entry and session facts are immutable and the same objects call after call: their
        # decision is found by identity, without building and hashing the authorizer's full cache key.
        key = (id(identity), id(entry), id(session))
        known = self._call_decisions.get(key)
        if known is not None and known[0] is identity and known[1] is entry and known[2] is session:
            return known[3]
        decision = self.authorizer.authorize(identity, "call_tool", self.tool_target(entry), arguments, session)
        if len(self._call_decisions) > 4096:
            self._call_decisions.clear()
        self._call_decisions[key] = (identity, entry, session, decision)
        return decision

    def argument_plan(self, entry: ToolEntry) -> "_ArgumentPlan":
        """What checking ``entry``'s arguments takes, worked out once per catalog entry."""
        plan = self._argument_plans.find(entry)
        if plan is None:
            plan = self._argument_plans.keep(entry, self._plan_arguments(entry))
        return plan

    def _plan_arguments(self, entry: ToolEntry) -> "_ArgumentPlan":
        schema = entry.definition.get("inputSchema") if self.config.schema_validation else None
        guards = (g for g in self.guards if g.applies_to(entry))
        return _ArgumentPlan(
            self.schemas.validator(schema) if schema is not None else None,
            tuple((g.argument, g.argument.startswith("/"), g.check, g.rule) for g in guards),
            declared_keys(entry.definition.get("inputSchema")) if self.refuses_undeclared(entry) else None,
        )

    def refuses_undeclared(self, entry: ToolEntry) -> bool:
        """Whether ``policy.undeclared_arguments`` refuses arguments ``entry``'s input schema does not declare."""
        setting, _ = self.config.undeclared_setting(entry.server)
        return setting == "refuse" or (
            setting == "refuse_untrusted" and entry.server_trust not in ("reviewed", "trusted")
        )

    def check_arguments(self, entry: ToolEntry, arguments: Any) -> Decision:
        """Input schema, then every guard that applies; the first refusal wins."""
        plan = self.argument_plan(entry)
        if plan.validator is not None:
            verdict = check_compiled(arguments, plan.validator)
            if verdict.reason is not None:
                return Decision.deny(SCHEMA_RULE, verdict.reason)
        declared = plan.declared
        # The common case, a flat schema and declared keys only, costs one set comparison.
        if declared is not None and not (type(arguments) is dict and not declared.nested
                                         and arguments.keys() <= declared.keys):
            verdict = check_declared(arguments, declared, *self.config.undeclared_setting(entry.server))
            if verdict.reason is not None:
                return Decision.deny(UNDECLARED_RULE, verdict.reason)
        by_name = type(arguments) is dict
        for where, pointer, check, rule in plan.guards:
            if by_name and not pointer:
                # An argument name: the values ``_pointer_values`` would yield, without a generator.
                node = arguments.get(where, _MISSING)
                if node is _MISSING:
                    continue
                if type(node) is not list:
                    reason = check(node).reason
                    if reason is not None:
                        return Decision.deny(rule, f"argument '{where}': {reason}")
                    continue
                values: Any = node
            else:
                values = _pointer_values(arguments, where)
            for value in values:
                reason = check(value).reason
                if reason is not None:
                    return Decision.deny(rule, f"argument '{where}': {reason}")
        return _ARGUMENTS_ACCEPTED

    def decide_call(
        self,
        identity: Identity,
        entry: ToolEntry,
        arguments: Mapping[str, Any] | None,
        session: SessionFacts | None = None,
    ) -> CallReport:
        report = CallReport()
        authorization = self.authorize_call(identity, entry, arguments, session)
        report.stages.append(("authorization", authorization))
        if authorization.effect is Effect.DENY:
            return report
        report.stages.append(("guards", self.check_arguments(entry, arguments or {})))
        return report


def _pins_from(config: PolicyConfig) -> Callable[[ToolEntry], bool]:
    """Pinned-ness from the configured pins file; without one, no tool is pinned."""
    path = config.pins_path()
    if path is None:
        return lambda entry: False
    return PinnedTools(read_pins(path))


def load_policy_config(path: Path) -> tuple[PolicyConfig, list[dict[str, Any]]]:
    """Read the ``policy`` table and an optional ``tools`` list from a TOML or JSON file."""
    import json
    import tomllib

    raw = path.read_bytes()
    data = tomllib.loads(raw.decode("utf-8")) if path.suffix.lower() == ".toml" else json.loads(raw)
    policy = dict(data.get("policy", {}))
    policy.setdefault("base_dir", str(path.parent.resolve()))
    return PolicyConfig.model_validate(policy), list(data.get("tools", []))


def load_claim_attributes(path: Path) -> tuple[str, ...]:
    """The principal attributes the file's ``auth.claims.attributes`` names (policies may read them), in order."""
    import json
    import tomllib

    raw = path.read_bytes()
    data = tomllib.loads(raw.decode("utf-8")) if path.suffix.lower() == ".toml" else json.loads(raw)
    auth = data.get("auth")
    claims = auth.get("claims") if isinstance(auth, dict) else None
    attributes = claims.get("attributes") if isinstance(claims, dict) else None
    return tuple(attributes) if isinstance(attributes, dict) else ()


def tool_entries(tools: Sequence[Mapping[str, Any]], default_server: str = "server") -> list[ToolEntry]:
    """Tool entries from ``{"server", "trust", "tool": {...}}`` or bare Tool objects (given ``default_server``)."""
    entries = []
    for item in tools:
        definition = dict(item.get("tool", item))
        server = str(item.get("server", default_server)) if "tool" in item else default_server
        trust = str(item.get("trust", "untrusted")) if "tool" in item else "untrusted"
        name = str(definition.get("name", ""))
        entries.append(ToolEntry(f"{server}__{name}", server, name, definition, trust))
    return entries
