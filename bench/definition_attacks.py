"""Definitions that smuggle instructions (issue 28): detection and false positives per cluster and surface, and what
the normalisation costs.

    python bench/definition_attacks.py [--json] [--misses]

Reads data/guardrails/content_attacks_definitions.jsonl. Each line is one definition (a tool, prompt, resource or
template: scanned as the metadata guardrail scans it), a server's ``instructions`` (screened as ``initialize``
screens them), or a set of servers' tool lists (``servers``: listed through the metadata guardrail over a catalog
of those servers, for split orders and look-alike names). A line counts as flagged when the guardrail withholds
something of it. Then the cost: the BFCL catalog's definitions scanned with and without the other readings
(``normalise``), per definition; and a ``tools/call`` through the metadata guardrail, timed and with the number of
times the normaliser ran (it must be none: definitions are scanned once per catalog and cached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bastion.guardrails import injection, normalise  # noqa: E402
from bastion.guardrails.config import GuardrailsConfig  # noqa: E402
from bastion.guardrails.injection import MetadataGuard, scan_definition, screen_instructions  # noqa: E402
from bastion.guardrails.report import InterventionLog  # noqa: E402
from bastion.model import GatewayRequest, Identity, Session, ToolEntry  # noqa: E402

CORPUS = ROOT / "data" / "guardrails" / "content_attacks_definitions.jsonl"
BFCL = ROOT.parent / "shared" / "data" / "routing" / "bfcl" / "tools.jsonl"
SESSION = Session(Identity("bench"), "legacy", "2025-11-25", {})


class Catalog:
    """The tools of a few servers, as the gateway's catalog shows them to a guardrail."""

    def __init__(self, entries: list[ToolEntry]) -> None:
        self._entries = {entry.exposed_name: entry for entry in entries}
        self._tools = tuple(self._entries.values())

    def tool(self, name: str) -> ToolEntry | None:
        return self._entries.get(name)

    def tools(self) -> tuple[ToolEntry, ...]:
        return self._tools


def catalog_of(servers: list[dict[str, Any]]) -> Catalog:
    entries = []
    for server in servers:
        for definition in server["tools"]:
            exposed = f"{server['name']}__{definition['name']}"
            entries.append(ToolEntry(exposed, server["name"], definition["name"], {**definition, "name": exposed},
                                     server.get("trust", "untrusted")))
    return Catalog(entries)


def listed(servers: list[dict[str, Any]], log: InterventionLog | None = None) -> tuple[set[str], set[str]]:
    """The exposed names a tools/list through the metadata guardrail keeps, and those it withholds."""
    catalog = catalog_of(servers)
    guard = MetadataGuard(GuardrailsConfig(), log or InterventionLog(), catalog)
    every = [dict(entry.definition) for entry in catalog.tools()]

    async def upstream(_request: GatewayRequest) -> dict[str, Any]:
        return {"tools": every}

    result = asyncio.run(guard(GatewayRequest("tools/list", {}, SESSION, catalog), upstream))
    kept = {tool["name"] for tool in result["tools"]}
    return kept, {tool["name"] for tool in every} - kept


def flagged(record: dict[str, Any]) -> bool:
    if "servers" in record:
        return bool(listed(record["servers"])[1])
    if record.get("kind") == "instructions":
        return screen_instructions(record["text"], "withhold")[0] is None
    return scan_definition(record["definition"]).flagged


def detection(misses: bool) -> list[dict[str, Any]]:
    rows: dict[tuple[str, str, int], Counter] = {}
    wrong = []
    for line in CORPUS.read_text().splitlines():
        record = json.loads(line)
        key = (record["cluster"], record["surface"], record["label"])
        row = rows.setdefault(key, Counter())
        row["texts"] += 1
        hit = flagged(record)
        row["flagged"] += hit
        if hit != bool(record["label"]):
            wrong.append(record["id"])
    if misses and wrong:
        print("wrong verdicts: " + ", ".join(wrong), file=sys.stderr)
    return [{"cluster": c, "surface": s, "kind": "attack" if label else "benign", "texts": row["texts"],
             "flagged": row["flagged"], "rate": round(row["flagged"] / row["texts"], 4)}
            for (c, s, label), row in sorted(rows.items(), key=lambda item: (-item[0][2], item[0][0], item[0][1]))]


def benign_as_definitions(limit: int = 150) -> list[dict[str, Any]]:
    """The benign corpora of bench/injection_eval.py (AgentDojo's environment, BIPIA's contexts, the research docs,
    package documents, the BFCL catalog) read as definitions, with the other readings and without them: what the
    normalisation adds to false positives where no attack is."""
    from injection_eval import catalog_samples, committed_corpora, ordinary_outputs

    samples = [s for s in (*committed_corpora(), *catalog_samples(), *ordinary_outputs(limit)) if not s.label
               and s.corpus != "git-log" and s.corpus != "python-sources"]
    rows: dict[str, Counter] = {}
    for sample in samples:
        definition = sample.definition or {"name": "t", "description": sample.text[:normalise.MAX_TEXT]}
        row = rows.setdefault(sample.corpus, Counter())
        row["texts"] += 1
        row["flagged"] += scan_definition(definition).flagged
        original = injection.reading_findings
        injection.reading_findings = lambda text, identifier=False: []
        try:
            row["flagged_without_readings"] += scan_definition(definition).flagged
        finally:
            injection.reading_findings = original
    return [{"corpus": corpus, **row} for corpus, row in sorted(rows.items())]


def bfcl_definitions() -> list[dict[str, Any]]:
    if not BFCL.exists():
        return []
    tools = [json.loads(line) for line in BFCL.read_text().splitlines() if line.strip()]
    return [{k: tool[k] for k in ("name", "description", "inputSchema") if k in tool} for tool in tools]


def definition_cost(definitions: list[dict[str, Any]], rounds: int = 3) -> dict[str, float]:
    """Microseconds per definition of ``scan_definition``, with the other readings and without them."""

    def timed() -> float:
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            for definition in definitions:
                scan_definition(definition)
            best = min(best, time.perf_counter() - started)
        return best / len(definitions) * 1e6

    with_readings = timed()
    original = injection.reading_findings
    injection.reading_findings = lambda text, identifier=False: []  # the scan as it was before issue 28
    try:
        without = timed()
    finally:
        injection.reading_findings = original
    return {"definitions": len(definitions), "us_per_definition": round(with_readings, 1),
            "us_per_definition_without_readings": round(without, 1)}


def call_cost(definitions: list[dict[str, Any]], calls: int = 20_000) -> dict[str, float]:
    """A tools/call through the metadata guardrail once the catalog is decided: microseconds per call, and how many
    times the normaliser ran during the calls."""
    servers = [{"name": "bfcl", "tools": definitions[:200]}]
    catalog = catalog_of(servers)
    guard = MetadataGuard(GuardrailsConfig(), InterventionLog(), catalog)
    names = [entry.exposed_name for entry in catalog.tools()]

    async def upstream(_request: GatewayRequest) -> dict[str, Any]:
        return {"content": [], "isError": False}

    requests = [GatewayRequest("tools/call", {"name": names[i % len(names)], "arguments": {}}, SESSION, catalog)
                for i in range(calls)]
    counted = Counter()
    original = normalise.readings

    def counting(text: str) -> Any:
        counted["readings"] += 1
        return original(text)

    async def run() -> float:
        for request in requests[:len(names)]:  # every tool decided once, as the first calls after a listing do
            try:
                await guard(request, upstream)
            except Exception:  # a withheld tool's refusal
                pass
        injection.readings = counting
        started = time.perf_counter()
        for request in requests:
            try:
                await guard(request, upstream)
            except Exception:
                pass
        return time.perf_counter() - started

    try:
        seconds = asyncio.run(run())
    finally:
        injection.readings = original
    return {"calls": calls, "us_per_call": round(seconds / calls * 1e6, 2), "normaliser_runs": counted["readings"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--misses", action="store_true", help="name the lines with a wrong verdict (stderr)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the guardrail's own report of each withholding: the table says it
    rows = detection(args.misses)
    definitions = bfcl_definitions()
    cost = {"per_definition": definition_cost(definitions), "per_call": call_cost(definitions)} if definitions else {}
    benign = benign_as_definitions()
    if args.json:
        print(json.dumps({"rows": rows, "benign_as_definitions": benign, "cost": cost}, indent=1))
        return
    print(f"{'cluster':<15} {'surface':<26} {'kind':<7} {'texts':>5} {'flagged':>7} {'rate':>7}")
    for row in rows:
        print(f"{row['cluster']:<15} {row['surface']:<26} {row['kind']:<7} {row['texts']:>5} {row['flagged']:>7} "
              f"{row['rate']:>7.1%}")
    for kind in ("attack", "benign"):
        total = sum(r["texts"] for r in rows if r["kind"] == kind)
        hit = sum(r["flagged"] for r in rows if r["kind"] == kind)
        print(f"{'all ' + kind:<50} {total:>5} {hit:>7} {hit / max(total, 1):>7.1%}")
    print(f"\n{'benign corpus read as definitions':<34} {'texts':>5} {'flagged':>7} {'before':>7}")
    for row in benign:
        print(f"{row['corpus']:<34} {row['texts']:>5} {row['flagged']:>7} {row['flagged_without_readings']:>7}")
    if cost:
        print(f"cost: {json.dumps(cost)}")


if __name__ == "__main__":
    main()
