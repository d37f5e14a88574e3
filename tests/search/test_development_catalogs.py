"""The development catalogs under data/search/: loadable, of the style each claims, with sources and licences
written down, and the hybrid ahead of either of its parts on each (what the fusion weights were chosen for)."""

from __future__ import annotations

from pathlib import Path

import pytest
import regex

from bastion.search.evaluate import load_catalog, load_queries, recall_at_k
from bastion.search.index import ToolIndex

from .conftest import REPO

DATA = REPO / "data" / "search"
CATALOGS = ("mcp_servers", "plugins", "multilingual")
PERMISSIVE = ("MIT", "Apache-2.0", "ISC", "BSD")


def _load(name: str):
    tools = load_catalog(DATA / name / "tools.jsonl")
    queries = load_queries(DATA / name / "queries.jsonl", known_ids={t["id"] for t in tools})
    return tools, queries


@pytest.mark.parametrize("name", CATALOGS)
def test_a_catalog_loads_and_every_tool_is_asked_for(name):
    tools, queries = _load(name)  # unknown ids, duplicate ids and bad rows raise here
    asked = set().union(*(q.relevant for q in queries))
    assert len(tools) >= 200 and len(queries) >= 0.8 * len(tools)
    assert asked == {t["id"] for t in tools}, "a tool no query asks for says nothing about search"
    assert all(isinstance(t.get("description"), str) and t["description"].strip() for t in tools)


@pytest.mark.parametrize("name", CATALOGS)
def test_a_catalog_names_its_sources_and_their_licences(name):
    readme = (DATA / name / "README.md").read_text(encoding="utf-8")
    tools, _ = _load(name)
    for prefix in {t["id"].split("/", 1)[0] for t in tools}:
        assert prefix in readme, f"{name}: the README does not say where {prefix!r} came from"
    assert any(licence in readme for licence in PERMISSIVE)
    assert (DATA / name / "build.py").is_file()


def test_the_catalogs_are_of_different_styles():
    mcp, _ = _load("mcp_servers")
    plugins, _ = _load("plugins")
    multilingual, multilingual_queries = _load("multilingual")
    assert len(mcp) >= 300 and len({t["id"].split("/", 1)[0] for t in mcp}) >= 20  # several hundred, many servers
    assert sum(bool(t["inputSchema"].get("properties")) for t in mcp) > 0.8 * len(mcp)
    assert all(t["inputSchema"] == {} for t in plugins)  # prose only
    han = regex.compile(r"\p{Han}")
    german = regex.compile(r"\b(?:der|die|das|und|für|von|mit|eine?|nach|zu|im|des|werden)\b", regex.IGNORECASE)
    assert sum(bool(han.search(t["description"])) for t in multilingual) >= 100
    assert sum(bool(german.search(t["description"])) and not han.search(t["description"]) for t in multilingual) >= 100
    assert sum(bool(han.search(q.query)) for q in multilingual_queries) >= 90


@pytest.mark.slow
@pytest.mark.parametrize("name", CATALOGS)
def test_on_each_catalog_the_hybrid_finds_more_than_bm25_or_minilm_alone(name, tmp_path):
    tools, queries = _load(name)
    index = ToolIndex(key_field="id", cache_dir=tmp_path)
    assert index.mode == "hybrid", index.fallback_reason
    index.build(tools)
    recalled = {"hybrid": 0.0, "bm25": 0.0, "minilm": 0.0}
    for q in queries:
        recalled["hybrid"] += recall_at_k([key for key, _ in index.search(q.query, 5)], set(q.relevant), 5)
        keys, lexical, _, semantic = index.score_components(q.query)
        for label, scores in (("bm25", lexical), ("minilm", semantic)):
            ranked = [keys[i] for i in scores.argsort()[::-1][:5]] if scores is not None else []
            recalled[label] += recall_at_k(ranked, set(q.relevant), 5)
    index.close()
    assert recalled["hybrid"] > max(recalled["bm25"], recalled["minilm"]), recalled
