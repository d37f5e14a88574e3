"""Token counts with tiktoken's o200k_base / cl100k_base, built offline from packaged vocabularies."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from bastion.search.canonical import canonical_tool_bytes, canonical_tools_bytes
from bastion.search.economics import catalog_cost, count_tokens
from bastion.search.meta_tools import meta_tool_definitions
from bastion.search.tokenizers_offline import EncodingLoader, EncodingUnavailable

from .conftest import CATALOG, REPO


@pytest.fixture(scope="module")
def encodings():
    loader = EncodingLoader()
    return {name: loader.get(name) for name in ("o200k_base", "cl100k_base")}


def test_known_token_ids(encodings):
    assert encodings["o200k_base"].encode_ordinary("hello world") == [24912, 2375]
    assert encodings["cl100k_base"].encode_ordinary("hello world") == [15339, 1917]
    assert encodings["o200k_base"].n_vocab == 200019
    assert encodings["cl100k_base"].n_vocab == 100277


# The ids quicktok 0.4.0, an independent implementation of both encodings, gave for the text below (their count and
# the sha256 of their comma-separated list): the vendored files must tokenize it the same.
REFERENCE_IDS = {"o200k_base": (380, "37272e31fd65c9288c36bb17a98ddf40a0c161b3476eea114a3a10d9b08c0892"),
                 "cl100k_base": (368, "88a04c1d56ab7965a58eaafdc82f19403b3f004fe1ef99b90e5d1488116a60b9")}


def test_same_ids_as_an_independent_tokenizer(encodings):
    text = canonical_tools_bytes(CATALOG).decode() + " naïve café 東京 😀 123456 \n\n  tabs\tand   spaces"
    for name, enc in encodings.items():
        ids = enc.encode_ordinary(text)
        assert (len(ids), hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()) == REFERENCE_IDS[name]


def test_unknown_encoding_is_refused():
    with pytest.raises(EncodingUnavailable, match="unknown encoding"):
        EncodingLoader().get("p50k_base")


def test_catalog_cost_per_server_total_and_search_mode(encodings):
    catalog = {"github": CATALOG[:2], "misc": CATALOG[2:]}
    cost = catalog_cost(catalog, encodings, always_listed=["read_file"], k=3)
    assert [s.server for s in cost.servers] == ["github", "misc"]
    assert [s.tools for s in cost.servers] == [2, len(CATALOG) - 2]
    for name, enc in encodings.items():
        assert cost.all_mode[name] == count_tokens(enc, canonical_tools_bytes(CATALOG))
        assert cost.servers[0].tokens[name] == count_tokens(enc, canonical_tools_bytes(CATALOG[:2]))
        expected_search = canonical_tools_bytes([*meta_tool_definitions(), CATALOG[4]])
        assert cost.search_mode[name] == count_tokens(enc, expected_search)
        per_tool = [count_tokens(enc, canonical_tool_bytes(t)) for t in CATALOG]
        assert cost.per_search_result[name] == round(3 * sum(per_tool) / len(per_tool))
    assert cost.always_listed == ["read_file"]


def test_search_mode_saves_tokens_on_a_large_catalog(encodings):
    catalog = {f"server{i}": [dict(t, name=f"s{i}_{t['name']}") for t in CATALOG] for i in range(20)}
    cost = catalog_cost(catalog, {"o200k_base": encodings["o200k_base"]})
    assert cost.total_tools == 20 * len(CATALOG)
    assert cost.saving("o200k_base") > 0.9


def test_counting_works_without_any_network_or_tiktoken_cache(tmp_path):
    """In a network namespace with no route, with an empty tiktoken cache: nothing to fetch."""
    script = (
        "from bastion.search.tokenizers_offline import EncodingLoader;"
        "l = EncodingLoader();"
        "print(len(l.get('o200k_base').encode_ordinary('offline token counting')),"
        " len(l.get('cl100k_base').encode_ordinary('offline token counting')))"
    )
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path), DATA_GYM_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3", "3"]
    assert list(tmp_path.iterdir()) == []
