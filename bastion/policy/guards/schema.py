"""JSON Schema validation of ``tools/call`` arguments against the tool's ``inputSchema``.

Validators are compiled once per distinct schema (keyed by a hash of its canonical JSON) with
jsonschema-rs, offline: a ``$ref`` to the network is never fetched, and a schema that needs one fails to
compile, which refuses the call (fail closed). MCP input schemas default to draft 2020-12.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import jsonschema_rs
import orjson

from bastion.policy.decision import PASS, GuardResult, refuse


def compile_schema(schema: Mapping[str, Any]) -> Any:
    """A validator for ``schema``; raises ValueError when it cannot be compiled offline."""
    options = {"offline": True}
    try:
        if isinstance(schema, Mapping) and "$schema" in schema:
            return jsonschema_rs.validator_for(dict(schema), **options)
        return jsonschema_rs.Draft202012Validator(dict(schema), **options)
    except (jsonschema_rs.ValidationError, ValueError, TypeError) as error:
        raise ValueError(str(error).splitlines()[0]) from error


class SchemaCache:
    """Compiled validators by schema hash, bounded so a server churning definitions cannot grow it."""

    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._by_hash: OrderedDict[bytes, Any] = OrderedDict()
        # The catalog hands out the same definition object on every call; skip re-hashing it.
        self._by_identity: dict[int, tuple[Mapping[str, Any], Any]] = {}

    def validator(self, schema: Mapping[str, Any]) -> Any:
        known = self._by_identity.get(id(schema))
        if known is not None and known[0] is schema:
            return known[1]
        digest = hashlib.blake2b(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
        compiled = self._by_hash.get(digest)
        if compiled is None:
            try:
                compiled = compile_schema(schema)
            except ValueError as error:
                compiled = error
            self._by_hash[digest] = compiled
            if len(self._by_hash) > self._capacity:
                self._by_hash.popitem(last=False)
        if len(self._by_identity) > self._capacity:
            self._by_identity.clear()
        self._by_identity[id(schema)] = (schema, compiled)
        return compiled


@dataclass(frozen=True, slots=True)
class DeclaredKeys:
    """The argument names an input schema declares in ``properties``, worked out once per tool.

    ``nested``: for each declared property whose own schema declares ``properties`` (an object, or the
    ``items`` of an array), the names declared there. A schema without ``properties`` declares nothing.
    """

    keys: frozenset[str]
    nested: tuple[tuple[str, bool, "DeclaredKeys"], ...]  # (property, its items rather than itself, declared)


def declared_keys(schema: Any, depth: int = 0) -> DeclaredKeys:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(properties, Mapping):
        return DeclaredKeys(frozenset(), ())
    nested = []
    if depth < 32:  # a schema deeper than this is checked down to here
        for name, sub in properties.items():
            if not isinstance(sub, Mapping):
                continue
            if isinstance(sub.get("properties"), Mapping):
                nested.append((name, False, declared_keys(sub, depth + 1)))
            items = sub.get("items")
            if isinstance(items, Mapping) and isinstance(items.get("properties"), Mapping):
                nested.append((name, True, declared_keys(items, depth + 1)))
    return DeclaredKeys(frozenset(properties), tuple(nested))


def undeclared_keys(arguments: Any, declared: DeclaredKeys, where: str = "") -> list[str]:
    """The keys of ``arguments`` (and of nested objects whose schema declares properties) not declared, as
    JSON Pointers; the common case, a flat call with declared keys only, costs one set comparison."""
    if type(arguments) is not dict:
        return []
    if arguments.keys() <= declared.keys:
        if not declared.nested:
            return []
        found = []
    else:
        found = [f"{where}/{_escape(k)}" for k in arguments if k not in declared.keys]
    for name, items, inner in declared.nested:
        value = arguments.get(name)
        if items:
            if type(value) is list:
                for index, element in enumerate(value):
                    found += undeclared_keys(element, inner, f"{where}/{_escape(name)}/{index}")
        else:
            found += undeclared_keys(value, inner, f"{where}/{_escape(name)}")
    return found


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _shown(pointer: str) -> str:
    """A key named in a refusal, cut short and escaped: a key is chosen by the model and may itself carry data."""
    return repr(pointer if len(pointer) <= 40 else pointer[:37] + "...")


def check_declared(arguments: Any, declared: DeclaredKeys, setting: str,
                   key: str = "policy.undeclared_arguments") -> GuardResult:
    """``key`` names the setting that refused, so the person knows which one to change."""
    found = undeclared_keys(arguments, declared)
    if not found:
        return PASS
    names = ", ".join(_shown(p) for p in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return refuse(
        f"undeclared argument{'s' if len(found) > 1 else ''} {names}: the tool's input schema does not declare "
        f"{'them' if len(found) > 1 else 'it'} in 'properties' ({key} = \"{setting}\")"
    )


def _describe(error: Any) -> str:
    where = "/" + "/".join(str(p) for p in error.instance_path)
    keyword = error.schema_path[-1] if error.schema_path else "schema"
    return f"argument {where} fails the '{keyword}' rule of the tool's input schema"


def check_schema(arguments: Any, schema: Mapping[str, Any] | None, cache: SchemaCache) -> GuardResult:
    if schema is None:
        return PASS
    return check_compiled(arguments, cache.validator(schema))


def check_compiled(arguments: Any, validator: Any) -> GuardResult:
    """``arguments`` against a validator from ``SchemaCache.validator`` (a ValueError when it failed to compile)."""
    if type(validator) is ValueError:
        return refuse("the tool's input schema cannot be compiled offline")
    if validator.is_valid(arguments):
        return PASS
    first = next(iter(validator.iter_errors(arguments)), None)
    return refuse(_describe(first) if first is not None else "the arguments do not match the input schema")
