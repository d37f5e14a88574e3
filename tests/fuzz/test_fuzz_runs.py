"""Each fuzz harness for a few thousand inputs, as part of the suite: its seeds first, then what libFuzzer makes of
them under coverage guidance (a fixed seed, so a run is repeatable). A few seconds a target; bench/fuzz.py runs
each for a million. A failure shows the oracle that broke and the input, as libFuzzer printed them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.targets import CORPUS, TARGETS

ROOT = Path(__file__).resolve().parents[2]
# Inputs per target: about the same few seconds each (the config loader writes a file and validates a
# configuration per input; the scanners' and the pins diff's inputs are texts and definitions of up to 200 KB).
RUNS = {"config": 400, "scanners": 300, "pin_diff": 100, "path_guard": 2000}


@pytest.mark.parametrize("target", TARGETS)
def test_the_harness_finds_nothing_in_a_short_run(target: str, tmp_path: Path) -> None:
    runs = RUNS.get(target, 3000)
    command = [sys.executable, "-m", "tests.fuzz.run", target, f"-runs={runs}", "-seed=1", "-max_total_time=120",
               "-timeout=30", f"-artifact_prefix={tmp_path}/", str(tmp_path / "found"), str(CORPUS / target)]
    (tmp_path / "found").mkdir()
    # libFuzzer ends the process with C's exit, past Python's atexit: the harnesses' scratch folders go in tmp_path.
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, errors="replace", timeout=300,
                          env=environment)
    output = done.stdout + done.stderr
    report = "\n".join(line for line in output.splitlines() if not line.startswith(("#", "INFO:", "WARNING:", '"')))
    assert done.returncode == 0, report[-4000:]
    assert f"Done {runs} runs" in done.stderr or "Done" in done.stderr, report[-2000:]
