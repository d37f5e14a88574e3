"""Coverage-guided fuzzing of every harness in tests/fuzz (atheris on libFuzzer), each for up to a million inputs:
inputs run, inputs/s, coverage (libFuzzer's ``cov:`` edges and ``ft:`` features of Bastion's instrumented code),
crashes, and peak RSS, one target at a time.

Each target starts from its seed corpus (tests/fuzz/corpus/<target>/, never written to: what a run finds goes to
a temporary folder) and stops at ``--runs`` inputs or ``--seconds`` of wall time, whichever comes first; a target
stopped by time says how far it got. A crash (an oracle's assertion or an exception) leaves its input in
``--artifacts`` and is counted; the run goes on with the next target.

Usage: .venv/bin/python bench/fuzz.py [--runs N (1000000)] [--seconds S (600)] [--targets a,b] [--artifacts DIR]
       [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz.targets import CORPUS, TARGETS  # noqa: E402

_PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+).*?exec/s: (\d+) rss: (\d+)Mb", re.MULTILINE)
_DONE = re.compile(r"^Done (\d+) runs in (\d+) second", re.MULTILINE)
_PEAK = re.compile(r"^stat::peak_rss_mb:\s+(\d+)", re.MULTILINE)
_RUNS = re.compile(r"^stat::number_of_executed_units:\s+(\d+)", re.MULTILINE)


def fuzz(target: str, runs: int, seconds: int, artifacts: Path) -> dict[str, object]:
    """One target's run and what libFuzzer said of it."""
    with tempfile.TemporaryDirectory(prefix=f"bastion-fuzz-{target}-") as top:
        found, scratch = os.path.join(top, "found"), os.path.join(top, "scratch")
        os.mkdir(found)
        os.mkdir(scratch)
        command = [sys.executable, "-m", "tests.fuzz.run", target, f"-runs={runs}", f"-max_total_time={seconds}",
                   "-print_final_stats=1", f"-artifact_prefix={artifacts}/{target}-", "-timeout=30",
                   "-rss_limit_mb=2048", found, str(CORPUS / target)]
        started = time.monotonic()
        # libFuzzer ends the process with C's exit, past Python's atexit: scratch folders go in this one.
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, errors="replace",
                              env={**os.environ, "TMPDIR": scratch})
        wall = time.monotonic() - started
    log = done.stderr
    progress = _PROGRESS.findall(log)
    executed = _RUNS.search(log) or _DONE.search(log)
    inputs = int(executed.group(1)) if executed else (int(progress[-1][0]) if progress else 0)
    peak = _PEAK.search(log)
    return {
        "target": target,
        "inputs": inputs,
        "seconds": round(wall, 1),
        "inputs_per_second": round(inputs / wall) if wall else 0,
        "cov": int(progress[-1][1]) if progress else None,
        "ft": int(progress[-1][2]) if progress else None,
        "crashes": 0 if done.returncode == 0 else 1,  # libFuzzer stops at the first
        "crash": _crash_line(log) if done.returncode else None,
        "peak_rss_mb": int(peak.group(1)) if peak else (int(progress[-1][4]) if progress else None),
        "reached_runs": inputs >= runs,
    }


def _crash_line(log: str) -> str:
    for line in log.splitlines():
        if line.startswith(("AssertionError", "TypeError", "ValueError", "RecursionError", "==")) or "Error:" in line:
            return line[:200]
    return log.strip().splitlines()[-1][:200] if log.strip() else "(no output)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--artifacts", type=Path, default=Path(tempfile.gettempdir()) / "bastion-fuzz-artifacts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.artifacts.mkdir(parents=True, exist_ok=True)
    results = []
    for target in args.targets.split(","):
        result = fuzz(target, args.runs, args.seconds, args.artifacts)
        results.append(result)
        print(f"{target}: {result['inputs']:,} inputs in {result['seconds']} s ({result['inputs_per_second']:,}/s), "
              f"cov {result['cov']} ft {result['ft']}, crashes {result['crashes']}, peak RSS "
              f"{result['peak_rss_mb']} MB{'' if result['reached_runs'] else ' (stopped by time)'}"
              + (f"\n  crash: {result['crash']}" if result["crash"] else ""), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.nice(10)  # a shared machine: fuzzing takes what the others leave
    main()
