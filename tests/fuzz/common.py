"""What the harnesses share: JSON values drawn from a fuzzer's bytes, and the equality JSON numbers need."""

from __future__ import annotations

import math
from typing import Any

import atheris

KEYS = ["jsonrpc", "id", "method", "params", "result", "error", "code", "message", "data", "_meta", "name",
        "arguments", "uri", "requestId", "progressToken", "level", "protocolVersion", "capabilities", "clientInfo",
        "notifications", "io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientCapabilities",
        "io.modelcontextprotocol/clientInfo", "io.modelcontextprotocol/logLevel", "supportedVersions", "tools",
        "description", "inputSchema", "properties", "required", "type", "enum", "annotations", "readOnlyHint"]
STRINGS = ["2.0", "initialize", "notifications/initialized", "notifications/cancelled", "tools/call", "tools/list",
           "server/discover", "subscriptions/listen", "logging/setLevel", "ping", "2025-11-25", "2026-07-28",
           "2025-06-18", "debug", "error", "object", "string", "bastion-1", "", "\u0000", "\ud7ff\ue000"]


def json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """A JSON value (no lone surrogates, no NaN) whose shape the fuzzer steers; biased to MCP's own words."""
    pick = fdp.ConsumeIntInRange(0, 11 if depth < 6 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return fdp.ConsumeBool()
    if pick == 2:
        return fdp.ConsumeIntInRange(-(2**63), 2**64 - 1)
    if pick == 3:
        return fdp.ConsumeIntInRange(-3, 10)
    if pick == 4:
        value = fdp.ConsumeRegularFloat()
        return value if math.isfinite(value) else 0.5
    if pick == 5:
        return fdp.PickValueInList(STRINGS)
    if pick == 6:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if pick in (7, 8):
        return {json_key(fdp): json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))}
    if pick == 9:
        return [json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {"jsonrpc": "2.0", json_key(fdp): json_value(fdp, depth + 1)}


def json_key(fdp: atheris.FuzzedDataProvider) -> str:
    if fdp.ConsumeIntInRange(0, 3):
        return fdp.PickValueInList(KEYS)
    return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8))


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: a number equal whatever its Python type (an integer wider than 64 bits is read as a
    double), true never equal to 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
