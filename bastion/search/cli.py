"""``bastion tools eval`` and ``bastion tools stats``.

Human-readable output goes to stderr; ``--json`` writes one JSON document to stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import orjson

from bastion.search.stack import search_stack

CatalogLoader = Callable[[str | None], Mapping[str, Sequence[Mapping[str, Any]]]]


EVAL_DESCRIPTION = "Measure tool retrieval on your own catalog: Recall@1/5/10, nDCG@10, MRR, build time, query latency."
STATS_DESCRIPTION = "Prompt tokens that tool definitions cost: every schema listed versus search mode."


def _eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bastion tools eval", description=EVAL_DESCRIPTION)
    _add_eval_arguments(p)
    return p


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tools", required=True, type=Path, metavar="TOOLS.jsonl",
                   help="one tool per line: {id, name, description, inputSchema}")
    p.add_argument("--queries", required=True, type=Path, metavar="QUERIES.jsonl",
                   help="one query per line: {query, relevant: [tool ids]}")
    p.add_argument("--k", type=int, default=5, help="also report Recall@K (default 5)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--lexical-only", action="store_true",
                   help="BM25 alone, without the embedding models (without it, a missing model is an error)")
    p.add_argument("--doc-tokens", type=int, default=128, metavar="N",
                   help="word pieces embedded per tool (default 128; 32 builds ~3x faster, slightly lower recall)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="reuse tool embeddings stored here across runs (default: none)")


def eval_main(argv: list[str]) -> int:
    return _run_eval(_eval_parser().parse_args(argv))


def _run_eval(args: argparse.Namespace) -> int:
    from bastion.search.evaluate import CatalogFileError, evaluate_index, format_report, load_catalog, load_queries
    from bastion.search.index import ToolIndex

    if args.k < 1:
        print("bastion tools eval: --k must be at least 1", file=sys.stderr)
        return 2
    try:
        tools = load_catalog(args.tools)
        queries = load_queries(args.queries, known_ids={t["id"] for t in tools})
    except (OSError, CatalogFileError) as exc:
        print(f"bastion tools eval: {exc}", file=sys.stderr)
        return 2
    encoder = None if args.lexical_only else "auto"
    if not args.lexical_only and not (stack := search_stack()).complete:
        # A lexical figure reported as the catalog's search quality would be read as the hybrid's.
        print(f"bastion tools eval: cannot run the hybrid search here: tool search runs on {stack.describe()}; "
              "pass --lexical-only to measure BM25 alone", file=sys.stderr)
        return 1
    report = evaluate_index(
        tools, queries, k=args.k,
        make_index=lambda: ToolIndex(key_field="id", encoder=encoder, cache_dir=args.cache_dir,
                                     doc_max_tokens=args.doc_tokens),
    )
    if args.json:
        sys.stdout.write(orjson.dumps(report.as_json(), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        print(format_report(report), file=sys.stderr)
    if not args.lexical_only and report.mode != "hybrid":  # the packages were there but a model failed to load
        print(f"bastion tools eval: the hybrid search did not run ({'; '.join(report.notes) or report.mode}); "
              "pass --lexical-only to measure BM25 alone", file=sys.stderr)
        return 1
    return 0


def _stats_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bastion tools stats", description=STATS_DESCRIPTION)
    _add_stats_arguments(p)
    return p


def _add_stats_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", metavar="CONFIG", help="Bastion configuration whose live catalog to measure")
    p.add_argument("--catalog", type=Path, metavar="FILE",
                   help="measure a catalog file instead: JSON {server: [tools]} or JSONL tools with an optional 'server' field")
    p.add_argument("--always", action="append", default=[], metavar="TOOL",
                   help="a tool listed in search mode too (repeatable)")
    p.add_argument("--k", type=int, default=5, help="tools returned by one search call (default 5)")
    p.add_argument("--encoding", action="append", choices=["o200k_base", "cl100k_base"],
                   help="tokenizer(s) to count with (default both)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")


def load_catalog_file(path: Path) -> dict[str, list[dict[str, Any]]]:
    """``{server: [tools]}`` from a JSON mapping or from JSONL rows (grouped by ``server``)."""
    raw = path.read_bytes()
    if path.suffix == ".json":
        data = orjson.loads(raw)
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise ValueError(f"{path}: expected a JSON object mapping server names to lists of tools")
        return {str(k): list(v) for k, v in data.items()}
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for lineno, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            row = orjson.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("name"), str):
                raise ValueError(f"{path}:{lineno}: expected a tool object with a 'name'")
            server = str(row.pop("server", "catalog"))
            row.pop("id", None)
            grouped[server].append(row)
    return dict(grouped)


def stats_main(argv: list[str], catalog_loader: CatalogLoader | None = None) -> int:
    """``catalog_loader(config_path)`` returns the live federated catalog ``{server: [tools]}``."""
    return _run_stats(_stats_parser().parse_args(argv), catalog_loader)


def _run_stats(args: argparse.Namespace, catalog_loader: CatalogLoader | None) -> int:
    from bastion.search.economics import DEFAULT_ENCODINGS, catalog_cost, format_cost
    from bastion.search.tokenizers_offline import EncodingLoader, EncodingUnavailable

    try:
        if args.catalog is not None:
            catalog = load_catalog_file(args.catalog)
        elif catalog_loader is not None:
            catalog = dict(catalog_loader(args.config))
        else:
            print("bastion tools stats: pass --catalog FILE (reading a live configuration needs the gateway)", file=sys.stderr)
            return 2
        loader = EncodingLoader()
        encodings = {name: loader.get(name) for name in (args.encoding or DEFAULT_ENCODINGS)}
    except (OSError, ValueError, EncodingUnavailable) as exc:
        print(f"bastion tools stats: {exc}", file=sys.stderr)
        return 2
    cost = catalog_cost(catalog, encodings, always_listed=args.always, k=args.k)
    stack = search_stack()
    if args.json:
        figures = {**cost.as_json(), "search": stack.as_json()}
        sys.stdout.write(orjson.dumps(figures, option=orjson.OPT_SORT_KEYS).decode() + "\n")
    else:
        print(format_cost(cost), file=sys.stderr)
        print(f"search runs on {stack.describe()}", file=sys.stderr)
    return 0


def register(subparsers: Any, catalog_loader: CatalogLoader | None = None) -> None:
    """Adds ``bastion tools eval|stats`` to the ``bastion`` command."""
    tools = subparsers.add_parser("tools", help="tool search: offline evaluation and token economics")
    sub = tools.add_subparsers(dest="tools_command", required=True)
    eval_parser = sub.add_parser("eval", help="evaluate tool retrieval on a catalog and queries file",
                                 description=EVAL_DESCRIPTION)
    _add_eval_arguments(eval_parser)
    eval_parser.set_defaults(handler=_run_eval)
    stats_parser = sub.add_parser("stats", help="prompt tokens of all schemas vs search mode", description=STATS_DESCRIPTION)
    _add_stats_arguments(stats_parser)
    stats_parser.set_defaults(handler=lambda args: _run_stats(args, catalog_loader))
