"""The guardrails' cost benchmark and the false-positive measurement run at all and print sane figures (never timing
thresholds: the machine is noisy). Real processes: the benchmark, `bastion run` both ways, the sized server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600


def _run(script: str, *args: str) -> dict | list:
    result = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return orjson.loads(result.stdout)


def test_the_cost_benchmark_times_every_path_and_checks_both_targets():
    report = _run("guardrails.py", "--quick", "--json")
    assert "scanning" in report["guardrails"]
    assert set(report["paths"]) == {"direct", "guardrails-on", "guardrails-off", "scanning-only"}
    for path in report["paths"].values():
        for size in ("small", "large"):
            assert 0 < path[size]["p50_ms"] <= path[size]["p90_ms"] < 60_000
    # A 1 MB answer costs more than a small one on every path: the figures are of the calls they say.
    assert all(path["large"]["p50_ms"] > path["small"]["p50_ms"] for path in report["paths"].values())
    assert [row["name"] for row in report["targets"]] == ["added p50, small result", "added p50, 1 MB result"]
    assert report["scanner"]["large_ms"] > 0 and report["scanner"]["small_findings"] == 0


def test_the_false_positive_measurement_reads_each_corpus():
    rows = _run("scanning_false_positives.py", "--json", "--limit-mb", "2")
    by_corpus = {row["corpus"]: row for row in rows}
    assert by_corpus["installed packages, source"]["mb"] > 1
    assert by_corpus["Bastion's docs"]["files"] > 0 and by_corpus["Bastion's docs"]["findings"] == {}
