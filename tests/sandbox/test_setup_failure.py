"""bwrap failing *after* its clone: the start fails at once with bwrap's own words, and nothing is left behind.

Such a failure leaves the sandbox's first process blocked for ever (it waits for its monitor's go), holding the
pipes the gateway reads. It happens where /proc is not the gateway's pid namespace's, as in a container given the
host's /proc: bwrap's monitor looks its child's pid up in /proc to read its namespaces, and exits when that pid is
not there. Here the gateway (``bastion sandbox run``, which starts its command as the gateway starts a server) runs
in a pid namespace of its own with the host's /proc, its pids set (``ns_last_pid``) to numbers the host does not
use. The doctor names that condition.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support import SANDBOX_TIERS, pids_with_tag

REPO = Path(__file__).parents[2]
RESERVED_PIDS = 300  # the kernel gives out no pid below this once it has gone round
pytestmark = SANDBOX_TIERS[0].marks[0]


def _free_pid_range(size: int) -> int:
    """A first pid from which ``size`` pids are unused on the host: the run nearest below the last pid the host gave
    out, where its allocator (which counts upwards) comes back only after going round its whole pid space."""
    with open("/proc/sys/kernel/pid_max") as handle:
        top = int(handle.read())
    with open("/proc/sys/kernel/ns_last_pid") as handle:
        last = int(handle.read())
    used = {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}
    free = 0
    for pid in itertools.chain(range(last, RESERVED_PIDS, -1), range(top - 1, last, -1)):
        free = 0 if pid in used else free + 1
        if free == size:
            return pid
    pytest.skip(f"the host has no {size} unused pids in a row")


def _line(stream, seconds: float) -> str:
    """The next line on ``stream``, or "" if none came within ``seconds`` (a hung start)."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else ""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is not installed (scripts/setup.sh)")
def test_a_bwrap_that_fails_after_its_clone_fails_the_start_and_leaves_nothing(tmp_path: Path):
    tag = f"after-clone-{uuid.uuid4().hex[:8]}"
    first = _free_pid_range(200)
    errors = tmp_path / "stderr"
    # The shell is the namespace's init: it stays until told, so that whatever the start left is still there to
    # be found (the namespace's processes die with its init).
    script = (f"echo {first} > /proc/sys/kernel/ns_last_pid || exit 99; "
              f'"$0" -m bastion sandbox run --quiet -- /bin/echo "$SANDBOX_TAG" 2>{errors}; echo "exit $?"; read _')
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    namespace = subprocess.Popen(["unshare", *user, "--pid", "--fork", "--kill-child", "/bin/sh", "-c", script,
                                  sys.executable], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env={**os.environ, "SANDBOX_TAG": tag})
    try:
        ended = _line(namespace.stdout, 120)
        assert ended.startswith("exit "), (ended, errors.read_text() if errors.exists() else "", namespace.poll())
        said = errors.read_text()
        assert ended.split()[1] != "0", said
        assert "sandbox for 'sandbox-run' failed to start: bwrap: open /proc/" in said, said
        assert "/ns failed" in said, said
        # The tag is in the command lines of bastion, its outer shell, bwrap's monitor and the sandbox's first
        # process (the namespace's shell has it in its environment only).
        assert pids_with_tag(tag) == []
    finally:
        namespace.stdin.close()
        namespace.wait(60)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux's unshare is not installed (scripts/setup.sh)")
def test_the_doctor_refuses_a_proc_of_another_pid_namespace():
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    doctor = [sys.executable, "-m", "bastion", "sandbox", "doctor", "--json"]
    own = subprocess.run(doctor, cwd=REPO, capture_output=True, text=True, timeout=120)
    foreign = subprocess.run(["unshare", *user, "--pid", "--fork", "--kill-child", *doctor], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    checks = {report: {check["name"]: check for check in json.loads(result.stdout)["checks"]}
              for report, result in (("own", own), ("foreign", foreign))}
    assert checks["own"]["proc"]["ok"], checks["own"]["proc"]
    assert own.returncode == 0, own.stderr
    assert not checks["foreign"]["proc"]["ok"]
    assert "/proc belongs to another pid namespace" in checks["foreign"]["proc"]["detail"]
    assert "procMount Unmasked" in checks["foreign"]["proc"]["detail"]
    assert foreign.returncode == 1 and not json.loads(foreign.stdout)["usable"]
