"""The benchmarks run at all and print sane figures (never timing thresholds: the machine is noisy).

Real processes over real pipes: the benchmarks themselves, the fixture servers, the relay and Bastion.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "dataplane.py"
FIXTURES = REPO / "bench" / "fixtures"
RUN_TIMEOUT_S = 180


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=REPO)


def assert_sane_mode(figures: dict[str, float], calls: int) -> None:
    assert figures["calls"] == calls
    assert 0 < figures["p50_ms"] <= figures["p99_ms"]
    assert figures["p50_ms"] < 1000, "an echo round trip over local pipes cannot take a second"
    assert figures["calls_per_s"] > 0


@pytest.fixture(scope="module")
def quick_report() -> dict:
    result = run_bench("--quick", "--paths", "direct,relay", "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


def test_quick_json_reports_both_paths(quick_report: dict) -> None:
    assert list(quick_report["paths"]) == ["direct", "relay"]
    for entry in quick_report["paths"].values():
        assert entry["status"] == "ok"
        assert entry["tool"] == "echo"
        assert_sane_mode(entry["sequential"], quick_report["calls"])
        assert_sane_mode(entry["inflight"], quick_report["calls"])
        assert entry["rss_mb"] > 1
        assert entry["cpu_us_per_call"] is not None and entry["cpu_us_per_call"] >= 0


def test_targets_that_need_absent_paths_are_skipped_not_guessed(quick_report: dict) -> None:
    assert [row["status"] for row in quick_report["targets"]] == ["SKIP"] * 4
    assert quick_report["bastion_idle_rss"] is None
    assert quick_report["context"]["relay_added_p50_ms"] is not None
    assert quick_report["context"]["bastion_added_p50_ms"] is None


def test_table_output_lists_paths_and_targets() -> None:
    result = run_bench("--quick", "--calls", "64", "--paths", "direct,relay")
    assert result.returncode == 0, result.stderr
    rows: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        if line.strip():
            rows.setdefault(line.split()[0], line.split())  # the first line naming a path is its table row
    for path in ("direct", "relay"):
        figures = [float(value) for value in rows[path][1:10]]
        latency_and_throughput, cpu_us, rss_mb = figures[:6], figures[7], figures[8]
        assert all(value > 0 for value in latency_and_throughput), rows[path]
        assert cpu_us >= 0 and rss_mb > 1, rows[path]  # 64 calls may fit in one CPU clock tick
    assert "target" in rows
    assert "[bench]" not in result.stdout, "progress belongs on stderr, out of the table"


def test_every_path_runs_with_the_policy_on_and_off() -> None:
    result = run_bench("--quick", "--calls", "64", "--json")
    assert result.returncode == 0, result.stderr
    report = orjson.loads(result.stdout)
    assert list(report["paths"]) == ["direct", "relay", "bastion", "bastion-off", "fastmcp"]
    for name, entry in report["paths"].items():
        assert entry["status"] == "ok", (name, entry)
        assert_sane_mode(entry["sequential"], 64)
        assert_sane_mode(entry["inflight"], 64)
    assert report["paths"]["bastion"]["tool"] == report["paths"]["bastion-off"]["tool"] == "echo__echo"
    latency_rows, other_rows = report["targets"][:2], report["targets"][2:]
    assert {row["status"] for row in other_rows} <= {"PASS", "MISS"}, other_rows
    # A divisor that noise made zero or less (the relay as fast as direct in 64 calls) is a SKIP that says so.
    assert all(row["status"] in ("PASS", "MISS") or row["note"] for row in latency_rows), latency_rows
    for name in ("bastion", "bastion-off"):  # the policy-off path stays reported beside the targets
        assert report["context"][f"{name}_added_p50_ms"] is not None
        assert report["context"][f"{name}_inflight_throughput_vs_direct"] > 0
    assert report["bastion_idle_rss"]["status"] == "ok" and report["bastion_idle_rss"]["tools"] == 10


def test_a_bastion_that_cannot_start_is_skipped_with_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-bastion"
    result = run_bench("--quick", "--calls", "32", "--paths", "direct,bastion", "--bastion", str(missing), "--json")
    assert result.returncode == 0, result.stderr
    report = orjson.loads(result.stdout)
    assert report["paths"]["direct"]["status"] == "ok"
    assert report["paths"]["bastion"]["status"] == "skipped"
    assert "no-such-bastion" in report["paths"]["bastion"]["reason"] or "FileNotFound" in report["paths"]["bastion"]["reason"]
    assert report["bastion_idle_rss"]["status"] == "skipped"
    assert "bastion: SKIPPED" in result.stderr


def test_unknown_path_is_rejected_by_name() -> None:
    result = run_bench("--paths", "direct,warp")
    assert result.returncode == 2
    assert "warp" in result.stderr


def exchange(argv: list[str], messages: list[dict]) -> list[dict]:
    payload = b"".join(orjson.dumps(message) + b"\n" for message in messages)
    result = subprocess.run(argv, input=payload, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return [orjson.loads(line) for line in result.stdout.splitlines()]


LEGACY_SESSION = [
    {"jsonrpc": "2.0", "id": "probe", "method": "server/discover", "params": {}},
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    *({"jsonrpc": "2.0", "id": 100 + n, "method": "tools/call",
       "params": {"name": "echo", "arguments": {"text": f"t{n}"}}} for n in range(32)),
    {"jsonrpc": "2.0", "id": 3, "method": "ping"},
]


@pytest.mark.parametrize("through_relay", [False, True], ids=["echo-server", "relay"])
def test_echo_fixture_speaks_the_legacy_lifecycle(through_relay: bool) -> None:
    echo = [sys.executable, str(FIXTURES / "echo_server.py")]
    argv = [sys.executable, str(FIXTURES / "relay.py"), *echo] if through_relay else echo
    answers = {answer["id"]: answer for answer in exchange(argv, LEGACY_SESSION)}
    assert len(answers) == 36, "one answer per request, none for the notification"
    assert answers["probe"]["error"]["code"] == -32601
    assert answers[1]["result"]["protocolVersion"] == "2025-06-18"
    assert answers[1]["result"]["capabilities"] == {"tools": {}}
    assert [tool["name"] for tool in answers[2]["result"]["tools"]] == ["echo"]
    assert answers[2]["result"]["tools"][0]["inputSchema"]["properties"]["text"]["type"] == "string"
    for n in range(32):
        assert answers[100 + n]["result"]["content"] == [{"type": "text", "text": f"t{n}"}]
    assert answers[3]["result"] == {}


def test_echo_fixture_answers_its_latest_version_to_an_unknown_offer() -> None:
    answers = exchange([sys.executable, str(FIXTURES / "echo_server.py")], [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    ])
    assert answers[0]["result"]["protocolVersion"] == "2025-11-25"


def test_policy_benchmark_runs_and_writes_every_audit_record(tmp_path: Path) -> None:
    figures_file = tmp_path / "policy.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "policy_overhead.py"), "--calls", "200", "--rounds", "1",
         "--json", str(figures_file)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    figures = orjson.loads(figures_file.read_bytes())
    assert figures["calls_per_pipeline"] == 200
    assert 0 < figures["on_p50_us"] <= figures["on_p99_us"]
    # Warm-up and timed calls, a decision and a call record each, the stage-cost pass, and the shutdown record.
    assert figures["audit_lines"] == 2 * (200 + 200 + 200) + 1
    assert "added" in result.stderr and "target" in result.stderr


def test_search_mode_scale_runs_end_to_end_on_a_small_catalog() -> None:
    result = subprocess.run([sys.executable, str(REPO / "bench" / "search_mode_scale.py"), "--size", "300",
                             "--calls", "50", "--searches", "3", "--minilm-searches", "5", "--embedding-tokens", "32",
                             "--json"],
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
    assert result.returncode == 0, result.stderr
    report = orjson.loads(result.stdout)
    assert report["tools"] == 300 and report["exit_status"] == 0
    assert report["first_answer_s"] > 0 and report["search_ms_p50"] > 0
    for phase in ("relay_idle_ms", "relay_indexing_ms"):
        assert 0 < report[phase]["p50"] <= report[phase]["p99"]
    assert "['call_tool', 'search_tools']" in result.stderr, "search mode lists the two meta-tools"
    assert report["embedding_tokens"] == 32 and report["minilm_in_s"] > 0
    assert 0 < report["minilm_search_ms_p50"] <= report["minilm_search_ms_p99"]


@pytest.mark.slow  # starts three real servers both ways
def test_launcher_startup_benchmark_times_both_paths_to_every_servers_tools() -> None:
    result = subprocess.run([sys.executable, str(REPO / "bench" / "launcher_startup.py"), "--rounds", "1", "--json"],
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO)
    assert result.returncode == 0, result.stderr
    report = orjson.loads(result.stdout)
    assert report["rounds"] == 1 and report["servers"] == ["filesystem", "memory", "everything"]
    figures = report["first_complete_tools_list"]
    for path in ("direct", "bastion"):
        assert 0 < figures[path]["min_ms"] <= figures[path]["median_ms"]
        assert report["tools"][path] > 30, "filesystem, memory and everything list over 30 tools between them"
    assert report["ratio"] == figures["bastion"]["median_ms"] / figures["direct"]["median_ms"]
    assert "ratio of medians bastion / direct" in result.stderr
    assert result.stdout.lstrip().startswith("{"), "the figures are the only thing on stdout"
