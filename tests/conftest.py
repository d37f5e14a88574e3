"""Every test, and every Bastion process a test starts (the SDK's stdio client's included), keeps its state (audit trail, approval queue, the demo's
scratch data) in a temporary folder, never in the home directory of whoever runs the tests; and its caches (the
derived MiniLM model, the compiled scanning rules, embeddings) in a temporary folder of this test run.

Under pytest-xdist (``make test``: ``-n N --dist loadfile``) each worker has a state folder of its own (a test's
pins and approvals are its worker's alone), and the workers share the run's cache folder, made by the controller
before they start: Bastion's caches are built for several processes at once (SQLite, files replaced whole), and a
cache is what one user's processes share.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import pytest

_STATE = tempfile.mkdtemp(prefix="bastion-test-state-")
# Set at import, before any test module builds a configuration; subprocesses inherit it.
os.environ["XDG_STATE_HOME"] = _STATE
# A Python process the tests start that dies of a fatal signal (SIGABRT, SIGSEGV) writes every thread's stack to its
# stderr first, which the failing test then shows: such a crash was once seen at a gateway's exit, with nothing said.
os.environ["PYTHONFAULTHANDLER"] = "1"
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_STARTED = pytest.StashKey[float]()
if _WORKER is None:  # the controller of a parallel run, or a run without workers; workers inherit its folder
    _CACHE: str | None = tempfile.mkdtemp(prefix="bastion-test-cache-")
    os.environ["XDG_CACHE_HOME"] = _CACHE
else:
    _CACHE = None


def _bytecode_cached_for_the_run() -> None:
    """With bytecode writing off (``PYTHONDONTWRITEBYTECODE``, as in CI), every Python the run starts (each worker,
    each ``bastion`` and fixture server, hundreds of them) would compile Bastion's modules from source again, and
    each worker would rewrite every test module's assertions again: about 0.2 s of CPU a process. The run keeps
    bytecode in its own cache folder instead (``PYTHONPYCACHEPREFIX``), so the source tree still gets no
    ``__pycache__`` and nothing outlives the run. Set by the controller before the workers start; they inherit it."""
    if _CACHE is None or not (sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    prefix = os.path.join(_CACHE, "bytecode")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


_bytecode_cached_for_the_run()


def _sdk_clients_pass_on_the_test_folders() -> None:
    """The SDK's stdio client starts a server with a small environment (HOME, PATH, USER, ...), as clients do, so a
    ``bastion run`` it starts would keep its state in the home directory of whoever runs the tests, shared by every
    test and every checkout. The test folders' two variables join that small environment; nothing else does."""
    import mcp.client.stdio

    for name in ("XDG_STATE_HOME", "XDG_CACHE_HOME"):
        if name not in mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS:
            mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS.append(name)


_sdk_clients_pass_on_the_test_folders()


@pytest.fixture(autouse=True)
def _no_pins_from_earlier_tests() -> None:
    """Tool pinning trusts what a server offers first: each test starts with no pins, so a server name another test
    gave other tools is not taken for a server that changed them."""
    try:
        os.unlink(os.path.join(_STATE, "bastion", "pins.json"))
    except FileNotFoundError:
        pass


# Folders whose test files share a session fixture between them: under pytest-xdist their files run on one worker.
# The conformance suite's runs (tests/conformance/runs.py) are made once and read by three files; the replicas behind
# HAProxy (tests/replicas/conftest.py) are started once for the fault and load files.
SHARED_BY_FILES = ("tests/conformance/", "tests/replicas/")


def _work_unit(nodeid: str) -> str:
    """What one worker runs as a whole: a test file, or a folder of SHARED_BY_FILES."""
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in SHARED_BY_FILES if path.startswith(folder)), path)


def pytest_collection_modifyitems(config, items) -> None:
    """Longest work first, so that the last worker to finish is not the one that drew a long unit late: the
    folders of SHARED_BY_FILES, then files with tests marked slow, then the rest, each in collection order."""
    slow_units = {_work_unit(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        unit = _work_unit(item.nodeid)
        return 0 if unit in SHARED_BY_FILES else 1 if unit in slow_units else 2

    items.sort(key=rank)  # stable: within a rank, and within a file, the order is as collected


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with each folder of SHARED_BY_FILES one unit and units handed out in the order above
    (pytest 9.2 ignores xdist_group marks: xdist 3.8 renames node ids in a way pytest no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False
    return FileScheduling(config, log)


def pytest_sessionstart(session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(trylast=True)  # after --durations' list, so the wall time is the last thing before the counts
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The suite's wall time, with the slowest tests (``--durations``) just above it: what each change cost."""
    if _STARTED not in config.stash:
        return
    elapsed = round(time.monotonic() - config.stash[_STARTED])
    workers = config.getoption("numprocesses", None) or 0
    how = f"{workers} worker(s)" if workers else "one process"
    terminalreporter.write_line(f"suite wall time: {elapsed // 60}m{elapsed % 60:02d}s ({elapsed} s) on {how}")


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_STATE, ignore_errors=True)
    if _CACHE is not None:
        shutil.rmtree(_CACHE, ignore_errors=True)
