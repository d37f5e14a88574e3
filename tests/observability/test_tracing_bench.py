"""bench/tracing_cost.py runs, and what it reports holds whatever the machine's load: tracing off makes the same
function calls per call as the chain from before tracing, and imports nothing of OpenTelemetry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tracing_off_calls_what_the_chain_before_tracing_called(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "bench" / "tracing_cost.py"), "--calls", "100", "--rounds", "1",
                             "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    counted = report["calls_per_call"]
    assert abs(counted["off"] - counted["absent"]) < 1  # a count, not a time: no noise to allow for
    assert counted["on"] > counted["off"] + 100  # spans were recorded: the count could fail
    assert report["otel_imported_when_off"] is False
