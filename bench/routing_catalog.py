"""A large synthetic tool catalog made by code from a real one, for scale benchmarks.

Each variant is a base tool re-published by a fictional server: a namespaced name, verbs
swapped for synonyms, a server-specific sentence, parameters reordered. Every variant's
text differs from every other, so nothing is embedded twice.
"""

from __future__ import annotations

import copy
import random
import re
from typing import Any, Sequence

SERVERS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka", "tyrell", "cyberdyne",
           "soylent", "aperture", "oscorp", "vandelay", "gringotts", "monarch", "dunder", "pied", "massive", "vehement")
SYNONYMS = {
    "calculate": "compute", "retrieve": "fetch", "get": "obtain", "find": "look up", "create": "make",
    "delete": "remove", "update": "modify", "list": "enumerate", "search": "query", "send": "dispatch",
    "check": "verify", "book": "reserve", "generate": "produce", "provide": "return", "given": "specified",
}
QUALIFIERS = (
    "Served by the {server} {region} cluster.", "Results come from {server}'s {region} mirror.",
    "Part of the {server} toolkit, {region} edition.", "Requires a {server} account in {region}.",
    "Backed by the {server} API ({region}).",
)
REGIONS = ("eu-west", "us-east", "ap-south", "sa-east", "ca-central", "af-south", "me-central", "eu-north")
_WORD = re.compile(r"\b(" + "|".join(SYNONYMS) + r")\b", re.IGNORECASE)


def _swap(match: re.Match[str]) -> str:
    word = match.group(0)
    repl = SYNONYMS[word.lower()]
    return repl.capitalize() if word[0].isupper() else repl


def _variant(tool: dict[str, Any], n: int, rng: random.Random) -> dict[str, Any]:
    server = SERVERS[n % len(SERVERS)]
    region = REGIONS[(n // len(SERVERS)) % len(REGIONS)]
    out = copy.deepcopy(tool)
    out["id"] = f"{tool['id']}~{n}"
    out["name"] = f"{server}{n // len(SERVERS)}_{tool['name']}"
    desc = _WORD.sub(_swap, tool.get("description", "")) if rng.random() < 0.7 else tool.get("description", "")
    out["description"] = f"{desc} {rng.choice(QUALIFIERS).format(server=server, region=region)}"
    props = out.get("inputSchema", {}).get("properties")
    if isinstance(props, dict) and len(props) > 1:
        items = list(props.items())
        rng.shuffle(items)
        out["inputSchema"]["properties"] = dict(items)
    return out


def synthetic_catalog(base: Sequence[dict[str, Any]], size: int, seed: int = 7) -> list[dict[str, Any]]:
    """``base`` plus generated variants up to ``size`` tools."""
    rng = random.Random(seed)
    tools = [copy.deepcopy(t) for t in base]
    n = 0
    while len(tools) < size:
        tools.append(_variant(base[n % len(base)], n, rng))
        n += 1
    return tools[:size]
