"""The HTTP benchmark runs end to end and reports every path (never a timing threshold: the machine is noisy).

Real processes on loopback: `bastion serve`, the floor relay on uvicorn, FastMCP's HTTP proxy, the echo server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "http_dataplane.py"
RUN_TIMEOUT_S = 300
MEASURED = ("direct", "null", "floor", "bastion-modern", "bastion-legacy", "fastmcp-legacy")


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=REPO)


@pytest.fixture(scope="module")
def quick_report() -> dict:
    result = run_bench("--quick", "--calls", "64", "--clients", "8", "--sessions", "20", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.lstrip().startswith("{"), "progress belongs on stderr, out of the JSON"
    return orjson.loads(result.stdout)


def test_every_path_ran_and_reports_sane_figures(quick_report: dict) -> None:
    paths = quick_report["paths"]
    assert list(paths)[: len(MEASURED)] == list(MEASURED)
    for name in MEASURED:
        entry = paths[name]
        assert entry["status"] == "ok", (name, entry)
        assert entry["sequential"]["calls"] == 64
        assert 0 < entry["sequential"]["p50_ms"] <= entry["sequential"]["p99_ms"]
        assert entry["client_cpu_us_per_call"] > 0
        if name != "direct":
            assert entry["concurrent"]["calls"] == 64, "8 clients with 8 calls each"
            assert entry["concurrent"]["calls_per_s"] > 0
            assert entry["rss_mb"] > 1
    modern_peer = paths["fastmcp-modern"]
    assert modern_peer["status"] == "ok" or modern_peer["reason"], "a peer that cannot speak an era says why"


def test_every_target_is_computed_from_the_run(quick_report: dict) -> None:
    targets = quick_report["targets"]
    assert len(targets) == 6, "three targets per era"
    assert {row["status"] for row in targets} <= {"PASS", "MISS"}, targets
    assert all(row["value"] > 0 for row in targets)
    assert quick_report["context"]["floor_added_p50_ms"] is not None


def test_idle_legacy_sessions_are_opened_and_measured(quick_report: dict) -> None:
    idle = quick_report["idle_sessions"]
    assert idle["status"] == "ok", idle
    assert idle["sessions"] == 20, "every initialize got a session id of its own"
    assert idle["rss_after_mb"] > 1 and idle["rss_before_mb"] > 1


def test_table_names_every_path_and_target() -> None:
    result = run_bench("--quick", "--calls", "16", "--clients", "4", "--sessions", "0",
                       "--paths", "direct,floor,bastion-legacy")
    assert result.returncode == 0, result.stderr
    first_words = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    for name in ("direct", "floor", "bastion-legacy", "target"):
        assert name in first_words, result.stdout
    assert "[bench]" not in result.stdout and "[bench] round 2/2 done" in result.stderr


def test_unknown_path_is_rejected_by_name() -> None:
    result = run_bench("--paths", "direct,warp")
    assert result.returncode == 2 and "warp" in result.stderr
