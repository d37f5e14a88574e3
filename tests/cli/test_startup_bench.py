"""bench/cli_startup.py runs and reports every command it times (never a timing threshold: the machine is noisy)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT

COMMANDS = ("python -c pass", "bastion --version", "bastion --help", "bastion check")


def test_the_startup_benchmark_times_each_command_and_counts_its_modules() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cli_startup.py"), "--quick", "--json"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert tuple(report["commands"]) == COMMANDS and report["runs"] == 3
    for name, figure in report["commands"].items():
        assert 0 < figure["min_s"] <= figure["median_s"] <= figure["max_s"], name
        assert figure["modules"] > 0, name
    modules = {name: figure["modules"] for name, figure in report["commands"].items()}
    # What the counts are for: --version imports next to nothing of Bastion, --help no command's machinery.
    assert modules["python -c pass"] < modules["bastion --version"] < modules["bastion --help"] < modules["bastion check"]
    assert report["target"]["measured_s"] == report["commands"]["bastion --version"]["median_s"]
    assert isinstance(report["target"]["met"], bool)
