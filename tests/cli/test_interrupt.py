"""Ctrl-C (SIGINT) ends any bastion command with one line on stderr and exit status 130, never a traceback.

Each test runs the real command as a subprocess, waits until it is in the middle of its work, sends it SIGINT
as a terminal's Ctrl-C would, and checks what it said, its status, and that its servers are gone.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BASTION, FIXTURES, pids_with_tag, wait_for

INTERRUPTED = "bastion: interrupted"


def _sigint_as_a_terminal_sends_it() -> None:
    """In the child before exec: SIGINT's default action, whatever this process inherited. A shell's background job
    (and so a test run started with `&`) ignores SIGINT, an ignored signal stays ignored across exec, and Python
    then installs no KeyboardInterrupt handler: the test would send a signal nobody hears."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], tmp_path: Path, **options) -> subprocess.Popen:
    options.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_environment(tmp_path), preexec_fn=_sigint_as_a_terminal_sends_it, **options)


def _environment(tmp_path: Path) -> dict[str, str]:
    """The test's own state and configuration; the caches (derived models, compiled rules) are the test run's."""
    env = dict(os.environ)
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return env


def _gated_server_config(tmp_path: Path, tag: str, **settings) -> tuple[Path, Path]:
    """A configuration of one server that never answers its handshake (until a gate file exists)."""
    marks = tmp_path / "marks.txt"
    server = {
        "command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), tag],
        "env": {"RAW_SERVER_MARKS": str(marks), "RAW_SERVER_HANDSHAKE_GATE": str(tmp_path / "never")},
        "sandbox": {"writable": [str(tmp_path)]}, "startup_timeout": 600, "trust": "trusted",
    }
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"raw": server}, **settings}))
    return config, marks


def _interrupt(process: subprocess.Popen, deadline: float = 60) -> tuple[int, str]:
    process.send_signal(signal.SIGINT)
    try:
        process.stdout_text, stderr = process.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        pytest.fail(f"bastion did not end within {deadline} s of SIGINT; stderr:\n{stderr}")
    return process.returncode, stderr


def _assert_interrupted(status: int, stderr: str) -> None:
    assert status == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "KeyboardInterrupt" not in stderr, stderr
    assert stderr.rstrip("\n").splitlines()[-1] == INTERRUPTED, stderr
    assert stderr.count(INTERRUPTED) == 1, stderr


def test_tools_waiting_for_a_server_ends_on_ctrl_c_and_stops_it(tmp_path):
    tag = f"interrupt-tools-{os.getpid()}"
    config, marks = _gated_server_config(tmp_path, tag)
    process = _start([BASTION, "tools", str(config)], tmp_path)
    try:
        assert wait_for(lambda: marks.exists() and "initialize received" in marks.read_text(), timeout=120)
        status, stderr = _interrupt(process)
    finally:
        if process.poll() is None:
            process.kill()
    _assert_interrupted(status, stderr)
    assert process.stdout_text == ""
    assert wait_for(lambda: not pids_with_tag(tag), timeout=30), "the server outlived bastion"


def test_call_waiting_for_a_slow_tool_ends_on_ctrl_c_and_stops_its_server(tmp_path):
    tag = f"interrupt-call-{os.getpid()}"
    marks = tmp_path / "marks.txt"
    server = {"command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), tag],
              "env": {"RAW_SERVER_MARKS": str(marks), "RAW_SERVER_MARK_CALLS": "1"},
              "sandbox": {"writable": [str(tmp_path)]}, "startup_timeout": 600}
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"raw": server}, "policy": "off"}))
    process = _start([BASTION, "call", str(config), "raw__slow"], tmp_path)
    try:
        assert wait_for(lambda: marks.exists() and '"slow"' in marks.read_text(), timeout=120)
        status, stderr = _interrupt(process)
    finally:
        if process.poll() is None:
            process.kill()
    _assert_interrupted(status, stderr)
    assert process.stdout_text == ""
    assert wait_for(lambda: not pids_with_tag(tag), timeout=30), "the server outlived bastion"


def test_run_ends_on_ctrl_c_after_stopping_its_servers(tmp_path):
    tag = f"interrupt-run-{os.getpid()}"
    # The client's initialize is answered after ready_timeout without the gated server: from then on the gateway
    # is serving, with its own signal handling.
    config, marks = _gated_server_config(tmp_path, tag, ready_timeout=1)
    process = _start([BASTION, "run", str(config)], tmp_path, stdin=subprocess.PIPE)
    try:
        process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}) + "\n")
        process.stdin.flush()
        assert select.select([process.stdout], [], [], 120)[0], "no answer to initialize"
        answer = json.loads(process.stdout.readline())
        assert answer["id"] == 1 and "result" in answer, answer
        assert wait_for(lambda: marks.exists() and "initialize received" in marks.read_text(), timeout=120)
        status, stderr = _interrupt(process)
    finally:
        if process.poll() is None:
            process.kill()
    _assert_interrupted(status, stderr)
    assert wait_for(lambda: not pids_with_tag(tag), timeout=30), "the server outlived bastion"


def test_sandbox_run_ends_on_ctrl_c_and_its_command_with_it(tmp_path):
    """`bastion sandbox run` waits on its command: Ctrl-C ends it the same way, and the command with it."""
    tag = f"interrupt-sandbox-{os.getpid()}"
    marks = tmp_path / "started"
    script = f"import pathlib, time; pathlib.Path({str(marks)!r}).write_text('x'); time.sleep(600)  # {tag}"
    process = _start([BASTION, "sandbox", "run", "--writable", str(tmp_path), "--", sys.executable, "-c", script],
                     tmp_path)
    try:
        assert wait_for(marks.exists, timeout=120)
        status, stderr = _interrupt(process)
    finally:
        if process.poll() is None:
            process.kill()
    _assert_interrupted(status, stderr)
    assert wait_for(lambda: not pids_with_tag(tag), timeout=30), "the sandboxed command outlived bastion"
