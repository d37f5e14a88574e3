"""Start-up that never waits on the slowest server: ``bastion run`` starts every server at once, when it starts;
a client's start waits at most ``ready_timeout`` for the ones still starting, and those join later with
list_changed; a server that fails says why, quoting its stderr; a missing executable is reported once.

Every test runs Bastion as a real subprocess over real pipes, with servers in the default sandbox. Servers are
made slow with a gate file (tests/fixtures/raw_server.py's RAW_SERVER_HANDSHAKE_GATE): a test decides when a
server becomes ready, so the tests assert the order of events, never how long anything took.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bastion.config import GatewayConfig
from bastion.protocol.versions import META_SUBSCRIPTION_ID, modern_meta
from tests.support import BASTION, RawClient, raw_server, wait_for

UPSTREAM_UNAVAILABLE = -32001
DEADLINE = 120.0  # seconds any one wait may take before it counts as hung


def gated_server(tmp_path: Path, gate: Path, name: str, tag: str, **extra) -> dict:
    """A raw server whose initialize answer waits for ``gate`` to exist; it marks what it received."""
    entry = raw_server(tmp_path / f"{name}.marks", tag=tag, **extra)
    entry["env"]["RAW_SERVER_HANDSHAKE_GATE"] = str(gate)
    return entry


def write(path: Path, servers: dict, **top_level) -> Path:
    # The tests call tools of fixture servers; policy has its own tests, and is off here in so many words. Every
    # tool is listed: two fixture servers are past the default exposure's bound, which would show search mode.
    path.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, **top_level, "servers": servers}))
    return path


def marks(tmp_path: Path, tag: str) -> list[str]:
    path = tmp_path / f"{tag}.marks"
    return path.read_text().splitlines() if path.exists() else []


def logged(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def tool_names(answer: dict) -> set[str]:
    return {tool["name"] for tool in answer["result"]["tools"]}


def start_beside_a_gated_server(tmp_path: Path, **top_level) -> tuple[RawClient, Path, Path]:
    """Bastion with a good server and one held at its handshake; returns once both have started and the good
    one is ready, before the client has sent anything."""
    gate = tmp_path / "gate"
    config = write(tmp_path / "bastion.json", {
        "good": raw_server(tmp_path / "good.marks", tag="startup-good"),
        # Far beyond every deadline here: the server is ready when the test opens the gate, never by a timeout.
        "slow": gated_server(tmp_path, gate, "slow", "startup-slow", startup_timeout=900),
    }, **top_level)
    log = tmp_path / "bastion.log"
    client = RawClient(config, log=log)
    # Both servers start with Bastion, in parallel, before the client's first message.
    assert wait_for(lambda: "server good ready" in logged(log), DEADLINE), logged(log)
    assert wait_for(lambda: "initialize received" in marks(tmp_path, "slow"), DEADLINE), logged(log)
    return client, gate, log


def test_the_default_wait_for_servers_is_a_few_seconds() -> None:
    assert GatewayConfig().ready_timeout <= 10


def test_a_hanging_server_does_not_hold_the_clients_start(tmp_path: Path) -> None:
    client, _gate, log = start_beside_a_gated_server(tmp_path)  # the gate is never opened
    try:
        answer = client.initialize()
        assert "result" in answer, answer
        assert answer["result"]["capabilities"]["tools"]["listChanged"] is True
        # The hanging server may bring prompts and resources when it joins: the client is told they may come.
        assert answer["result"]["capabilities"]["prompts"] == {"listChanged": True}
        assert answer["result"]["capabilities"]["resources"]["listChanged"] is True
        listed = client.request(1, "tools/list", {})
        # The hanging server was sent its handshake and never answered it: it is still not ready.
        assert [mark.split()[0] for mark in marks(tmp_path, "slow")] == ["started", "initialize"]
        refused = client.request(2, "tools/call", {"name": "slow__echo", "arguments": {"text": "hi"}})
        called = client.request(3, "tools/call", {"name": "good__echo", "arguments": {"text": "hi"}})
    finally:
        _, stderr = client.close()
    assert {"good__echo", "good__big"} <= tool_names(listed)
    assert not any(name.startswith("slow__") for name in tool_names(listed))
    assert refused["error"]["code"] == UPSTREAM_UNAVAILABLE
    assert "server 'slow' is not available: starting" in refused["error"]["message"]
    assert called["result"]["content"][0]["text"] == "hi"
    assert "server slow is not ready yet (starting); it joins when it is" in stderr


def test_a_server_ready_after_the_clients_start_joins_with_list_changed(tmp_path: Path) -> None:
    client, gate, log = start_beside_a_gated_server(tmp_path)
    try:
        client.initialize()
        before = client.request(1, "tools/list", {})
        assert not any(name.startswith("slow__") for name in tool_names(before))
        gate.touch()
        # The next message is the notification: nothing else is in flight.
        assert client.recv(DEADLINE) == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        after = client.request(2, "tools/list", {})
        called = client.request(3, "tools/call", {"name": "slow__echo", "arguments": {"text": "late but here"}})
    finally:
        client.close()
    assert {"slow__echo", "good__echo"} <= tool_names(after)
    assert called["result"]["content"][0]["text"] == "late but here"


def test_a_modern_clients_first_request_does_not_wait_for_a_hanging_server_and_its_listen_stream_gets_the_late_one(
        tmp_path: Path) -> None:
    client, gate, log = start_beside_a_gated_server(tmp_path)
    meta = modern_meta({}, {"name": "startup-test", "version": "0"})
    try:
        listed = client.request(1, "tools/list", {"_meta": meta}, timeout=DEADLINE)
        client.send({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen",
                     "params": {"notifications": {"toolsListChanged": True}, "_meta": meta}})
        acknowledged = client.recv(DEADLINE)
        gate.touch()
        changed = client.recv(DEADLINE)
        after = client.request(2, "tools/list", {"_meta": meta}, timeout=DEADLINE)
    finally:
        client.close()
    assert not any(name.startswith("slow__") for name in tool_names(listed))
    assert "good__echo" in tool_names(listed)
    assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
    assert changed["method"] == "notifications/tools/list_changed"
    assert changed["params"]["_meta"][META_SUBSCRIPTION_ID] == "listen"
    assert "slow__echo" in tool_names(after)


def test_one_shot_commands_wait_for_every_server_beyond_ready_timeout(tmp_path: Path) -> None:
    # `bastion tools` has no list_changed to take a late server in: it waits for each up to its startup_timeout,
    # however short ready_timeout (a client's wait) is.
    gate = tmp_path / "gate"
    config = write(tmp_path / "bastion.json", {
        "good": raw_server(tmp_path / "good.marks", tag="oneshot-good"),
        "slow": gated_server(tmp_path, gate, "slow", "oneshot-slow", startup_timeout=900),
    }, ready_timeout=0.1)
    tools = subprocess.Popen([BASTION, "tools", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert wait_for(lambda: "initialize received" in marks(tmp_path, "slow"), DEADLINE)
        time.sleep(1)  # well past ready_timeout: a one-shot command that gave up at ready_timeout has done so
        gate.touch()
        stdout, stderr = tools.communicate(timeout=DEADLINE)
    finally:
        if tools.poll() is None:
            tools.kill()
            tools.wait()
    assert tools.returncode == 0, stderr
    assert "slow__echo" in stdout and "good__echo" in stdout


def test_a_missing_executable_is_reported_once_and_not_restarted(tmp_path: Path) -> None:
    no_interpreter = tmp_path / "script-with-a-missing-interpreter"
    no_interpreter.write_text("#!/nonexistent/interpreter\n")
    no_interpreter.chmod(0o755)
    config = write(tmp_path / "bastion.json", {
        "good": raw_server(tag="missing-good"),
        "absent": {"command": str(tmp_path / "no-such-server")},
        "scripted": {"command": str(no_interpreter)},  # found on the host; its interpreter is not
        "bare": {"command": str(no_interpreter), "sandbox": "none"},  # the same without the sandbox
    }, ready_timeout=DEADLINE)
    log = tmp_path / "bastion.log"
    client = RawClient(config, log=log)
    try:
        client.initialize()
        # Several seconds, in which a retried start (0.5 s, 1 s, 2 s, ...) would have been logged again.
        time.sleep(4)
        answers = {name: client.request(i, "tools/call", {"name": f"{name}__anything", "arguments": {}})
                   for i, name in enumerate(("absent", "scripted", "bare"), start=1)}
        listed = client.request(9, "tools/list", {})
    finally:
        _, stderr = client.close()
    lines = stderr.splitlines()
    for name, needle in (("absent", "no-such-server"), ("scripted", "/nonexistent/interpreter"),
                         ("bare", no_interpreter.name)):
        reports = [line for line in lines if line.startswith(f"bastion WARNING bastion.server.{name}:")]
        assert len(reports) == 1, (name, reports)
        assert "not retried" in reports[0]
        assert needle in reports[0] or needle in stderr.split(reports[0], 1)[1].split("\nbastion ", 1)[0]
        error = answers[name]["error"]
        assert error["code"] == UPSTREAM_UNAVAILABLE
        assert f"server {name!r} is not available" in error["message"]
    assert not [line for line in lines if "restarting in" in line], stderr
    assert "good__echo" in tool_names(listed)


def test_what_a_server_writes_cannot_forge_or_control_the_gateways_log(tmp_path: Path) -> None:
    """A server's stderr is quoted in Bastion's log as the server's: its lines indented under the record that quotes
    them, its controls (carriage return, escape sequences, the Unicode line separators) written as escapes."""
    forged = "bastion ERROR bastion.policy: refused tools/call admin for alice"
    script = ("import sys\n"
              f"sys.stderr.write({forged!r} + '\\n')\n"
              "sys.stderr.write('progress\\r' + chr(27) + '[2J' + chr(0x2028) + 'bastion INFO forged too' + '\\n')\n"
              "sys.exit(1)\n")
    lines = (stderr := _stderr_beside_a_failing_server(tmp_path, "forging", script)).splitlines()
    assert f"    {forged}" in lines  # quoted, under the warning that quotes it
    assert not any(line.startswith(forged) or line.startswith("bastion INFO forged") for line in lines)
    assert "    progress\\r\\x1b[2J\\u2028bastion INFO forged too" in lines
    assert "\x1b" not in stderr and "\r" not in stderr and "\u2028" not in stderr


def _stderr_beside_a_failing_server(tmp_path: Path, name: str, script: str) -> str:
    """Bastion's stderr once the server ``name`` (running ``script``, which exits) has failed beside a good one."""
    config = write(tmp_path / "bastion.json", {
        "good": raw_server(tag=f"{name}-good"),
        name: {"command": sys.executable, "args": ["-c", script]},
    }, ready_timeout=DEADLINE)
    log = tmp_path / "bastion.log"
    client = RawClient(config, log=log)
    try:
        client.initialize()
        assert wait_for(lambda: f"bastion.server.{name}: server {name} failed to start: exited" in logged(log),
                        DEADLINE)
    finally:
        _, stderr = client.close()
    return stderr


def test_a_failing_servers_warning_quotes_its_last_stderr_lines(tmp_path: Path) -> None:
    script = ("import sys\n"
              "for n in range(8): print(f'loading part {n}', file=sys.stderr)\n"
              "print('boom: the database is locked', file=sys.stderr)\n"
              "sys.exit(1)\n")
    stderr = _stderr_beside_a_failing_server(tmp_path, "failing", script)
    warning, quoted = stderr.split("bastion WARNING bastion.server.failing: server failing failed to start: exited",
                                   1)[1].split("\n", 1)
    assert "restarting in" in warning  # a crash keeps its backoff
    assert "its last stderr lines:" in warning
    # Its last lines (up to ten), as the server wrote them, right under the warning.
    assert quoted.splitlines()[:9] == [f"    loading part {n}" for n in range(8)] + [
        "    boom: the database is locked"]
