"""Tool lists serialise to the same bytes whatever order they arrive in, across processes."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys

import orjson

from bastion.search.canonical import canonical_tool_list, canonical_tools_bytes

from .conftest import CATALOG, REPO


def reorder_keys(value, rng):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: reorder_keys(v, rng) for k, v in items}
    if isinstance(value, list):
        return [reorder_keys(v, rng) for v in value]
    return value


def test_bytes_identical_for_any_tool_order_and_key_order():
    reference = canonical_tools_bytes(CATALOG)
    rng = random.Random(3)
    for _ in range(25):
        tools = [reorder_keys(t, rng) for t in CATALOG]
        rng.shuffle(tools)
        assert canonical_tools_bytes(tools) == reference


def test_format_is_compact_sorted_and_ordered_by_name():
    data = canonical_tools_bytes([{"name": "b", "z": 1, "a": {"y": 2, "x": [3, {"d": 4, "c": 5}]}}, {"name": "a"}])
    assert data == b'[{"name":"a"},{"a":{"x":[3,{"c":5,"d":4}],"y":2},"name":"b","z":1}]'


def test_list_order_inside_schemas_is_kept():
    tool = {"name": "t", "inputSchema": {"required": ["b", "a"], "type": "object"}}
    assert canonical_tool_list([tool])[0]["inputSchema"]["required"] == ["b", "a"]


def test_servers_answering_in_different_orders_give_identical_lists():
    servers = [CATALOG[:3], CATALOG[3:5], CATALOG[5:]]
    outputs = {canonical_tools_bytes(itertools.chain(*perm)) for perm in itertools.permutations(servers)}
    assert len(outputs) == 1


def test_identical_across_processes_with_different_hash_seeds():
    script = (
        "import sys, random; from bastion.search.canonical import canonical_tools_bytes;"
        "from tests.search.conftest import CATALOG;"
        "tools = list(CATALOG); random.Random(int(sys.argv[1])).shuffle(tools);"
        "sys.stdout.buffer.write(canonical_tools_bytes(tools))"
    )
    outs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", script, seed], cwd=REPO, env=env, capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        outs.add(proc.stdout)
    assert len(outs) == 1
    assert [t["name"] for t in orjson.loads(outs.pop())] == sorted(t["name"] for t in CATALOG)
