"""The scale benchmark's synthetic catalog: the requested size, unique ids and names, no repeated text."""

from __future__ import annotations

import sys

from bastion.search.text import semantic_text

from .conftest import CATALOG, REPO

sys.path.insert(0, str(REPO / "bench"))
from routing_catalog import synthetic_catalog  # noqa: E402


def test_variants_are_distinct_and_deterministic():
    base = [dict(t, id=f"b{i}") for i, t in enumerate(CATALOG)]
    big = synthetic_catalog(base, 500)
    assert len(big) == 500 and big[: len(base)] == base
    assert len({t["id"] for t in big}) == 500
    assert len({t["name"] for t in big}) == 500
    assert len({semantic_text(t) for t in big}) == 500, "every tool text must cost a real embedding"
    assert synthetic_catalog(base, 500) == big
    assert base[0]["description"] == CATALOG[0]["description"], "the base tools are not modified"
