"""What tool definitions cost in prompt tokens: every schema listed versus search mode.

A tool's cost is the token count of its canonical JSON definition (what a client puts into
the model's tool list); providers wrap definitions in a few tokens of their own, the same
in both modes, so the comparison holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import tiktoken

from bastion.search.canonical import canonical_tool_bytes, canonical_tools_bytes
from bastion.search.meta_tools import meta_tool_definitions

DEFAULT_ENCODINGS = ("o200k_base", "cl100k_base")


def count_tokens(encoding: tiktoken.Encoding, data: bytes | str) -> int:
    text = data.decode() if isinstance(data, bytes) else data
    return len(encoding.encode_ordinary(text))


@dataclass
class ServerCost:
    server: str
    tools: int
    tokens: dict[str, int]  # encoding -> tokens of all this server's definitions


@dataclass
class CatalogCost:
    servers: list[ServerCost]
    total_tools: int
    all_mode: dict[str, int]  # the whole list, as one JSON array
    search_mode: dict[str, int]  # meta-tools + always-listed tools
    per_search_result: dict[str, int]  # k average tools returned by one search call
    always_listed: list[str] = field(default_factory=list)
    k: int = 5

    def saving(self, encoding: str) -> float:
        full = self.all_mode[encoding]
        return 1.0 - self.search_mode[encoding] / full if full else 0.0

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["saving"] = {enc: round(self.saving(enc), 4) for enc in self.all_mode}
        return data


def catalog_cost(
    catalog: Mapping[str, Sequence[Mapping[str, Any]]],
    encodings: Mapping[str, tiktoken.Encoding],
    *,
    always_listed: Iterable[str] = (),
    k: int = 5,
) -> CatalogCost:
    """Token costs of a federated catalog ``{server: [tool definitions]}``."""
    always = sorted(set(always_listed))
    all_tools = [t for tools in catalog.values() for t in tools]
    servers = []
    for server in sorted(catalog):
        blob = canonical_tools_bytes(catalog[server])
        servers.append(ServerCost(server, len(catalog[server]), {n: count_tokens(e, blob) for n, e in encodings.items()}))
    listed = [t for t in all_tools if t.get("name") in set(always)]
    search_list = canonical_tools_bytes([*meta_tool_definitions(), *listed])
    full_list = canonical_tools_bytes(all_tools)
    per_tool = {n: [count_tokens(e, canonical_tool_bytes(t)) for t in all_tools] for n, e in encodings.items()}
    return CatalogCost(
        servers=servers,
        total_tools=len(all_tools),
        all_mode={n: count_tokens(e, full_list) for n, e in encodings.items()},
        search_mode={n: count_tokens(e, search_list) for n, e in encodings.items()},
        per_search_result={n: round(k * sum(c) / len(c)) if c else 0 for n, c in per_tool.items()},
        always_listed=always,
        k=k,
    )


def format_cost(cost: CatalogCost) -> str:
    encs = list(cost.all_mode)
    width = max([len(s.server) for s in cost.servers] + [len("search mode"), 6])
    head = f"{'server':<{width}}  {'tools':>6}  " + "  ".join(f"{e:>12}" for e in encs)
    lines = [head, "-" * len(head)]
    for s in cost.servers:
        lines.append(f"{s.server:<{width}}  {s.tools:>6}  " + "  ".join(f"{s.tokens[e]:>12,}" for e in encs))
    lines.append("-" * len(head))
    lines.append(f"{'all (listed)':<{width}}  {cost.total_tools:>6}  " + "  ".join(f"{cost.all_mode[e]:>12,}" for e in encs))
    lines.append(f"{'search mode':<{width}}  {2 + len(cost.always_listed):>6}  " + "  ".join(f"{cost.search_mode[e]:>12,}" for e in encs))
    lines.append(
        "tokens saved on every turn: "
        + ", ".join(f"{e} {cost.all_mode[e] - cost.search_mode[e]:,} ({cost.saving(e):.1%})" for e in encs)
    )
    lines.append(
        f"one search call (k={cost.k}) returns about "
        + ", ".join(f"{cost.per_search_result[e]:,} {e} tokens" for e in encs)
        + " of definitions, paid only on turns that search"
    )
    return "\n".join(lines)
