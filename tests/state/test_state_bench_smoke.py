"""bench/state_store.py runs, in a quick mode, and measures every operation on both stores (never a timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import redis_available

BENCH = Path(__file__).resolve().parents[2] / "bench" / "state_store.py"


@pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")
def test_the_state_store_bench_measures_each_operation_on_both_stores() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--ops", "128", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert set(figures) == {"memory", "redis"} and set(figures["memory"]) == set(figures["redis"])
    assert "take (3 buckets)" in figures["redis"]
    for store in figures.values():
        for measured in store.values():
            assert all(value > 0 for value in measured.values())
