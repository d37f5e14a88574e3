"""Detection and false positives of the guardrails on content attacks in outputs and server requests, per cluster and
surface (issue 28).

Each line of ``data/guardrails/content_attacks_outputs.jsonl`` is sent through the guardrail chain the gateway builds
from the default configuration (``bastion.guardrails.chain.build_guardrails``, the one ``bastion run`` uses), around a
catalog of two servers: ``web`` (untrusted), which sends every case, and ``vault`` (trusted), which owns the resource
``vault://config/settings`` and the template ``vault://notes/{id}``. A case counts as caught when any guardrail
intervened (marked, redacted, withheld, refused, flagged) or what reached the client differs from what the server
sent; a benign case must pass unchanged. Surfaces:

- ``result``: a ``tools/call`` answer of one text block with the line's text (``arguments``: the call's own);
- ``result-json``: a whole ``tools/call`` answer, given as JSON;
- ``is-error``: an ``isError: true`` answer with the text; ``error``: a JSON-RPC error with the text as its
  message; ``error-data``: a JSON-RPC error whose ``data`` is the JSON given;
- ``sampling`` and ``elicitation``: a server's ``sampling/createMessage`` or ``elicitation/create`` params, given as
  JSON, sent ``repeat`` times (default once) by the same server toward the same client.

Run: ``.venv/bin/python bench/output_attacks.py [--misses] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bastion.gateway.catalog import Catalog, ServerFacts  # noqa: E402
from bastion.gateway.pipeline import build_pipeline  # noqa: E402
from bastion.guardrails.chain import build_guardrails  # noqa: E402
from bastion.guardrails.config import GuardrailsConfig  # noqa: E402
from bastion.guardrails.report import InterventionLog  # noqa: E402
from bastion.model import CallInFlight, GatewayError, GatewayRequest, Identity, Session  # noqa: E402

CORPUS = ROOT / "data" / "guardrails" / "content_attacks_outputs.jsonl"
TOWARD_CLIENT = {"sampling": "sampling/createMessage", "elicitation": "elicitation/create"}
TOOL = {"name": "tool", "inputSchema": {"type": "object"}}


def catalog() -> Catalog:
    built = Catalog([ServerFacts("web", "web", "untrusted"), ServerFacts("vault", "vault", "trusted")])
    built.update("web", "tools", [dict(TOOL)])
    built.update("web", "resources", [{"uri": "web://pages/today", "name": "today"}])
    built.update("vault", "resources", [{"uri": "vault://config/settings", "name": "settings"}])
    built.update("vault", "resourceTemplates", [{"uriTemplate": "vault://notes/{id}", "name": "note"}])
    return built


def server_message(case: dict[str, Any]) -> tuple[str, Any, dict[str, Any] | None]:
    """(method, what the server sends: a result or a request's params, its JSON-RPC error or None)."""
    surface, text = case["surface"], case["text"]
    if surface == "result":
        return "tools/call", {"content": [{"type": "text", "text": text}]}, None
    if surface == "result-json":
        return "tools/call", json.loads(text), None
    if surface == "is-error":
        return "tools/call", {"content": [{"type": "text", "text": text}], "isError": True}, None
    if surface == "error":
        return "tools/call", None, {"code": -32603, "message": text}
    if surface == "error-data":
        return "tools/call", None, {"code": -32603, "message": "The call failed.", "data": json.loads(text)}
    return TOWARD_CLIENT[surface], json.loads(text), None


def defaults(pins: Path) -> GuardrailsConfig:
    """The default guardrails, pinning into ``pins``: never the user's own pins file, which every Bastion process of
    the user shares."""
    return GuardrailsConfig(pins={"path": str(pins)})


def run_case(case: dict[str, Any], chain_catalog: Catalog, pins: Path) -> tuple[bool, list[str]]:
    """Whether the chain intervened in ``case`` or changed it; the guardrails and rules that did."""
    method, sent, error = server_message(case)
    interventions: list[Any] = []
    chain = build_guardrails(defaults(pins), InterventionLog(interventions.append), chain_catalog).all()
    toward_client = method in TOWARD_CLIENT.values()
    if toward_client:  # the gateway passes a server's request only through the interceptors that name its method
        chain = [each for each in chain if method in (getattr(each, "methods", None) or ())]
    forwarded: list[Any] = []

    async def terminal(request: GatewayRequest) -> Any:
        if toward_client:
            forwarded.append(copy.deepcopy(request.params))
            return {"action": "decline"} if method == "elicitation/create" else {
                "role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "m"}
        if error is not None:
            raise GatewayError.from_error(copy.deepcopy(error))
        return copy.deepcopy(sent)

    pipeline = build_pipeline(chain, terminal)
    session = Session(Identity("bench"), "legacy", "2025-11-25", {"sampling": {}, "elicitation": {}, "roots": {}},
                      {"name": "bench"}, "bench-session")
    changed = False
    for _ in range(case.get("repeat") or 1):
        arguments = case.get("arguments") or {}
        params = copy.deepcopy(sent) if toward_client else {"name": "web__tool", "arguments": arguments}
        request = GatewayRequest(method, params, session, chain_catalog, request_id=1,
                                 server="web" if toward_client else None,
                                 calls_in_flight=(CallInFlight("tools/call", 0),) if toward_client else ())
        try:
            answer = asyncio.run(pipeline(request))
        except GatewayError as refused:
            changed = changed or error is None or refused.to_error() != error
            continue
        given = forwarded[-1] if toward_client else answer
        changed = changed or given != (sent if not toward_client else params)
    found = sorted({f"{each['guardrail']}:{each['rule']}" for each in interventions})
    return changed or bool(interventions), found


def evaluate(cases: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    rows: dict[tuple[str, str, int], dict[str, Any]] = defaultdict(lambda: {"texts": 0, "caught": 0, "wrong": []})
    built = catalog()
    with tempfile.TemporaryDirectory() as scratch:
        judged = [(case, run_case(case, built, Path(scratch) / "pins.json")) for case in cases]
    for case, (caught, found) in judged:
        row = rows[(case["cluster"], case["surface"], case["label"])]
        row["texts"] += 1
        row["caught"] += caught
        if caught != bool(case["label"]):
            row["wrong"].append((case["id"], found))
    return rows


def main() -> None:
    import logging

    logging.disable(logging.WARNING)  # each intervention is also a warning line; the table says what matters here
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--misses", action="store_true", help="name each case judged wrongly")
    args = parser.parse_args()
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    rows = evaluate(cases)
    ordered = sorted(rows.items(), key=lambda item: (item[0][0], -item[0][2], item[0][1]))
    if args.json:
        print(json.dumps([{"cluster": c, "surface": s, "label": "attack" if l else "benign", "texts": r["texts"],
                           "caught": r["caught"]} for (c, s, l), r in ordered], indent=1))
        return
    print(f"{'cluster':<26} {'surface':<12} {'kind':<7} {'texts':>5} {'caught':>6} {'rate':>7}  what the rate is")
    for (cluster, surface, label), row in ordered:
        rate = row["caught"] / row["texts"]
        print(f"{cluster:<26} {surface:<12} {'attack' if label else 'benign':<7} {row['texts']:>5} {row['caught']:>6} "
              f"{rate:>7.1%}  {'detected' if label else 'changed (false positives)'}")
        if args.misses:
            for ident, found in row["wrong"]:
                print(f"    wrong: {ident} {found}")
    attacks = [r for (_, _, l), r in rows.items() if l]
    benign = [r for (_, _, l), r in rows.items() if not l]
    print(f"all attacks: {sum(r['caught'] for r in attacks)} of {sum(r['texts'] for r in attacks)} caught; "
          f"benign: {sum(r['caught'] for r in benign)} of {sum(r['texts'] for r in benign)} changed")


if __name__ == "__main__":
    main()
