"""What a status file keeps of a huge catalog is bounded: at most CATALOG_KEPT tools, each definition at most
DEFINITION_KEPT bytes and all of them at most DEFINITIONS_KEPT; a tool past a bound is listed without its definition
(the console says it was not counted), never dropped silently."""

from __future__ import annotations

import orjson

from bastion.model import ToolEntry
from bastion.running import CATALOG_KEPT, DEFINITION_KEPT, DEFINITIONS_KEPT, whole


def _tool(i: int, description_bytes: int) -> ToolEntry:
    return ToolEntry(f"big__t{i}", "big", f"t{i}", {"name": f"big__t{i}", "description": "x" * description_bytes,
                                                   "inputSchema": {"type": "object"}})


def test_the_catalog_in_a_status_file_is_bounded() -> None:
    many = whole({"catalog": [_tool(i, 10) for i in range(CATALOG_KEPT + 7)]})
    assert len(many["catalog"]) == CATALOG_KEPT and many["catalog_cut"] is True

    one_huge = whole({"catalog": [_tool(0, DEFINITION_KEPT), _tool(1, 10)]})
    assert [e["definition"] is None for e in one_huge["catalog"]] == [True, False]
    assert one_huge["catalog"][0]["bytes"] > DEFINITION_KEPT and one_huge["catalog_cut"] is False

    heavy = whole({"catalog": [_tool(i, 60_000) for i in range(300)]})
    kept = [e for e in heavy["catalog"] if e["definition"] is not None]
    assert len(heavy["catalog"]) == 300 and 0 < len(kept) < 300
    assert sum(e["bytes"] for e in kept) <= DEFINITIONS_KEPT
    assert len(orjson.dumps(heavy)) < DEFINITIONS_KEPT + 300 * 200
