"""What a ``bastion`` process costs before it does anything: ``bastion --version``, ``bastion --help`` and
``bastion check FILE``, each timed as a whole process against the interpreter alone (``python -c pass``), in one
run, and the modules each one imports, counted.

The commands alternate with the floor round by round, so the machine's load lands on all of them alike. Wall time
is a monotonic clock around spawn and exit; the module count (``python -X importtime``, one line per module
imported) does not depend on the machine's load at all, so it shows a regression that timing on a busy machine
would hide.

Target: ``bastion --version`` median <= 0.15 s wall.

Usage: .venv/bin/python bench/cli_startup.py [--runs N (20)] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_VERSION_SECONDS = 0.15
BIN = Path(sys.executable).parent
BASTION = str(BIN / "bastion")


def commands(config: Path) -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "bastion --version": [BASTION, "--version"],
        "bastion --help": [BASTION, "--help"],
        "bastion check": [BASTION, "check", str(config)],
    }


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          cwd=cwd)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    return elapsed


def modules_imported(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """How many modules the command imports, interpreter start-up included (``-X importtime`` lines). Run outside
    any checkout, so ``-m bastion`` is the installed one."""
    program = argv[1:] if argv[0] == sys.executable else ["-m", "bastion", *argv[1:]]
    done = subprocess.run([sys.executable, "-X", "importtime", *program], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    return sum(1 for line in done.stderr.decode(errors="replace").splitlines() if line.startswith("import time:")
               and not line.rstrip().endswith("| package"))


def measure(runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bastion-cli-bench-") as folder:
        config = Path(folder) / "bastion.json"
        # A server that is never started: `check` validates it, with the default policy parsed and checked.
        config.write_text(json.dumps({"servers": {"echo": {"command": sys.executable, "args": ["-c", "pass"]}}}))
        env = {**os.environ, "XDG_STATE_HOME": str(Path(folder) / "state"),
               "XDG_CONFIG_HOME": str(Path(folder) / "config")}
        argvs = commands(config)
        for argv in argvs.values():  # warm-up: the page cache, bytecode caches
            timed(argv, env, folder)
        seconds: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(runs):
            for name, argv in argvs.items():
                seconds[name].append(timed(argv, env, folder))
        modules = {name: modules_imported(argv, env, folder) for name, argv in argvs.items()}
    floor = statistics.median(seconds["python -c pass"])
    figures = {
        name: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
               "over_floor_s": statistics.median(values) - floor, "modules": modules[name]}
        for name, values in seconds.items()
    }
    version = figures["bastion --version"]["median_s"]
    return {"runs": runs, "commands": figures,
            "target": {"what": "bastion --version median wall", "goal_s": TARGET_VERSION_SECONDS,
                       "measured_s": version, "met": version <= TARGET_VERSION_SECONDS}}


def table(report: dict) -> str:
    lines = [f"{'command':<20} {'median s':>9} {'min s':>7} {'max s':>7} {'over python':>12} {'modules':>8}"]
    for name, figure in report["commands"].items():
        lines.append(f"{name:<20} {figure['median_s']:>9.3f} {figure['min_s']:>7.3f} {figure['max_s']:>7.3f} "
                     f"{figure['over_floor_s']:>12.3f} {figure['modules']:>8}")
    target = report["target"]
    lines.append(f"target: {target['what']} <= {target['goal_s']} s: {target['measured_s']:.3f} s, "
                 f"{'met' if target['met'] else 'MISSED'} ({report['runs']} runs each, interleaved)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each command (default 20)")
    parser.add_argument("--quick", action="store_true", help="3 runs: a check that it works")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    report = measure(3 if args.quick else args.runs)
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
