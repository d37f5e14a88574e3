"""Every test, and every Bastion process a test starts, keeps its state (audit trail, approval queue, the demo's
scratch data) in a temporary folder, never in the home directory of whoever runs the tests."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_STATE = tempfile.mkdtemp(prefix="bastion-test-state-")
# Set at import, before any test module builds a configuration; subprocesses inherit it.
os.environ["XDG_STATE_HOME"] = _STATE


@pytest.fixture(autouse=True)
def _no_pins_from_earlier_tests() -> None:
    """Tool pinning trusts what a server offers first: each test starts with no pins, so a server name another test
    gave other tools is not taken for a server that changed them."""
    try:
        os.unlink(os.path.join(_STATE, "bastion", "pins.json"))
    except FileNotFoundError:
        pass


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_STATE, ignore_errors=True)
