"""bench/sandbox_spawn.py runs and reports sane figures (no timing thresholds: the machine is noisy)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_sandbox_spawn_benchmark_runs():
    result = subprocess.run([sys.executable, str(REPO / "bench" / "sandbox_spawn.py"), "--rounds", "2", "--json"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    tiers = ("sandboxed", "unsandboxed", "gvisor") if shutil.which("runsc") else ("sandboxed", "unsandboxed")
    for section in ("tools_list", "trivial_command"):
        for name in tiers:
            figures = report[section][name]
            assert 0 < figures["min_ms"] <= figures["median_ms"] <= figures["p90_ms"]
    assert report["ratio"] > 0 and report["paired_ratio"] > 0
    if "gvisor" in tiers:
        assert report["gvisor"]["ratio_to_bubblewrap"] > 0 and "gVisor (runsc):" in result.stderr
    assert "ratio of medians" in result.stderr and "WITHOUT a sandbox" not in result.stderr
