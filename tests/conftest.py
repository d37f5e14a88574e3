"""Every test, and every Bastion process a test starts, keeps its state (audit trail, approval queue, the demo's
scratch data) in a temporary folder, never in the home directory of whoever runs the tests."""

from __future__ import annotations

import os
import shutil
import tempfile

_STATE = tempfile.mkdtemp(prefix="bastion-test-state-")
# Set at import, before any test module builds a configuration; subprocesses inherit it.
os.environ["XDG_STATE_HOME"] = _STATE


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_STATE, ignore_errors=True)
