"""The short version of bench/fault_run.py in the suite: the mixed load through HAProxy to three replicas on Redis for
about a minute and a half, every fault of the run injected at least once in a seeded order (a server killed mid-call,
one stopped while calls pile up, large results, a stream never read, concurrent resource writers, a full audit disk,
a gateway killed with its servers alive, a whole replica killed, Redis restarted). The same checks as the long run:
no request hung or was answered wrongly, every error fell in a fault's window, each fault's own expectations held,
fds and processes came back to their baseline, nothing was left with PPID 1. (The RSS slope is checked only over
five minutes or more: a minute of samples measures warm-up, not a leak; the long run checks it.)

Its own cluster, not the folder's shared one: the run kills replicas and mounts a disk for one's audit trail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from fault_run import FAULTS, Options, fault_run, render  # noqa: E402

pytestmark = pytest.mark.slow
SEED = 3207


def test_faults_injected_into_the_load_leave_no_hang_and_no_leak(tmp_path: Path) -> None:
    report = fault_run(Options(minutes=1.5, seed=SEED, clients=8, gap=(1.0, 3.0), warmup_seconds=8.0), tmp_path)
    print(render(report))
    assert report["failures"] == [], render(report)
    assert {w["kind"] for w in report["faults"]} == set(FAULTS)
    assert report["load"]["answered_right"] > 0
    assert report["load"]["errors_by_class"].get("hung", 0) == 0
