"""Approvals through ``bastion run`` on real servers: a call that waits for a person says so at once, with the
approval id and the command that settles it; a call is approved, denied, withdrawn (cancelled, disconnected,
its gateway killed) and timed out; and how many calls of a short session wait for a person on the demo, on a
stock ``mcpServers`` file and on the same servers once reviewed.

State (audit trail, approval queue) lives under a temporary XDG_STATE_HOME.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import BASTION, NODE_BIN, VENV_BIN, RawClient, raw_server, wait_for

LEGACY = "2025-11-25"
MODERN = "2026-07-28"


@pytest.fixture(autouse=True)
def _state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


class Client(RawClient):
    """A raw client of ``bastion run CONFIG`` (the demo when CONFIG is None) whose stderr goes to a file, so a
    long session cannot fill a pipe nobody reads."""

    def __init__(self, config: Path | None, stderr_file: Path) -> None:
        self.stderr_file = stderr_file
        with stderr_file.open("wb") as err:
            self.proc = subprocess.Popen([BASTION, "run", *([str(config)] if config else [])],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        self._buffer = bytearray()
        self.skipped: list[dict] = []

    def call(self, request_id: int, name: str, arguments: dict, *, progress_token: str | None = None,
             meta: dict | None = None) -> None:
        params: dict = {"name": name, "arguments": arguments}
        if progress_token is not None or meta:
            params["_meta"] = {**(meta or {}), **({"progressToken": progress_token} if progress_token else {})}
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})

    def wait_notice(self, request_id: int, timeout: float = 60.0) -> dict:
        """The notice that call ``request_id`` waits for a person; fails if the call is answered first."""
        while True:
            message = self.recv(timeout)
            if message.get("id") == request_id and "method" not in message:
                raise AssertionError(f"the call was answered without saying it waits for a person: {message}")
            if _is_wait_notice(message):
                return message
            self.skipped.append(message)

    def answer(self, request_id: int, timeout: float = 60.0) -> dict:
        """The response to ``request_id``; fails if another wait notice comes first."""
        while True:
            message = self.recv(timeout)
            if message.get("id") == request_id and "method" not in message:
                return message
            assert not _is_wait_notice(message), f"a second wait notice before the answer: {message}"
            self.skipped.append(message)

    def close(self) -> tuple[int, str]:
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.stderr_file.read_text(errors="replace")


def _is_wait_notice(message: dict) -> bool:
    params = message.get("params") or {}
    if message.get("method") == "notifications/progress":
        return "approval" in str(params.get("message", ""))
    if message.get("method") == "notifications/message":
        return params.get("logger") == "bastion" and isinstance(params.get("data"), dict) \
            and "approvalId" in params["data"]
    return False


def _command_of(notice: dict) -> tuple[str, str]:
    """The approval id and the command a notice says to run."""
    params = notice["params"]
    if notice["method"] == "notifications/message":
        return params["data"]["approvalId"], params["data"]["command"]
    found = re.search(r"`(bastion approve ([0-9a-f]+)[^`]*)`", params["message"])
    assert found, params["message"]
    return found.group(2), found.group(1)


def run_bastion(command: str | list[str]) -> subprocess.CompletedProcess:
    """Run a ``bastion ...`` command line as a person would type it."""
    argv = shlex.split(command) if isinstance(command, str) else command
    assert argv[0] == "bastion"
    return subprocess.run([BASTION, *argv[1:]], capture_output=True, text=True, timeout=60)


def _raw_config(tmp_path: Path, timeout_seconds: float = 120) -> Path:
    """The raw test server, untrusted, under the default policy: every call it gets waits for a person."""
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server()},
        "policy": {
            "approval": {"fallback": "queue", "timeout_seconds": timeout_seconds, "poll_seconds": 0.1,
                         "queue_dir": str(tmp_path / "queue")},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
        },
    }))
    return config


def _record(tmp_path: Path, approval_id: str) -> dict:
    return json.loads((tmp_path / "queue" / f"{approval_id}.json").read_text())


def _status_becomes(tmp_path: Path, approval_id: str, status: str) -> bool:
    return wait_for(lambda: _record(tmp_path, approval_id)["status"] == status, timeout=30)


def test_a_waiting_call_says_so_at_once_and_is_approved_or_denied_by_its_command(tmp_path: Path) -> None:
    client = Client(_raw_config(tmp_path), tmp_path / "stderr.log")
    queue = str(tmp_path / "queue")
    try:
        client.initialize(LEGACY)
        # With a progress token, the notice is a progress notification for that token.
        client.call(1, "raw__echo", {"text": "hello"}, progress_token="p-1")
        notice = client.wait_notice(1)
        assert notice["method"] == "notifications/progress" and notice["params"]["progressToken"] == "p-1"
        approval_id, command = _command_of(notice)
        assert command == f"bastion approve {approval_id} --queue-dir {queue}"

        listed = run_bastion(["bastion", "approvals", "--json", "--queue-dir", queue])
        assert listed.returncode == 0, listed.stderr
        [waiting] = json.loads(listed.stdout)
        assert (waiting["id"], waiting["server"], waiting["tool"], waiting["status"]) == \
            (approval_id, "raw", "echo", "pending")
        assert waiting["arguments"] == {"text": "hello"} and 0 < waiting["seconds_left"] <= 120
        table = run_bastion(["bastion", "approvals", "--queue-dir", queue])
        assert table.stdout.splitlines()[0].split()[:3] == ["ID", "WHO", "CALL"]
        assert approval_id in table.stdout and "raw/echo" in table.stdout

        approved = run_bastion(command)
        assert approved.returncode == 0, approved.stderr
        assert client.answer(1)["result"]["content"][0]["text"] == "hello"
        assert _record(tmp_path, approval_id)["status"] == "approved"

        # Without one, a warning log message from the logger "bastion", with the id and the command.
        client.call(2, "raw__echo", {"text": "again"})
        notice = client.wait_notice(2)
        assert notice["method"] == "notifications/message" and notice["params"]["level"] == "warning"
        second_id, command = _command_of(notice)
        assert second_id != approval_id and f"bastion approve {second_id}" in notice["params"]["data"]["message"]
        denied = run_bastion(["bastion", "deny", second_id, "--queue-dir", queue])
        assert denied.returncode == 0, denied.stderr
        refusal = client.answer(2)["error"]
        assert "not approved" in refusal["message"] and "denied" in refusal["message"]

        again = run_bastion(command)
        assert again.returncode != 0 and "already denied" in again.stderr

        empty = run_bastion(["bastion", "approvals", "--queue-dir", queue])
        assert empty.returncode == 0 and empty.stdout == "" and "no calls are waiting" in empty.stderr
        assert json.loads(run_bastion(["bastion", "approvals", "--json", "--queue-dir", queue]).stdout) == []
    finally:
        _, stderr = client.close()
    warned = [line for line in stderr.splitlines() if "WARNING" in line and approval_id in line]
    assert warned and f"bastion approve {approval_id}" in warned[0]


def test_a_modern_client_gets_the_log_notice_only_when_its_request_opts_in(tmp_path: Path) -> None:
    client = Client(_raw_config(tmp_path), tmp_path / "stderr.log")
    envelope = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"}}
    queue = tmp_path / "queue"
    try:
        client.call(1, "raw__echo", {"text": "quiet"}, meta=envelope)
        assert wait_for(lambda: len(list(queue.glob("*.json"))) == 1, timeout=60)
        [quiet_id] = [p.stem for p in queue.glob("*.json")]
        assert run_bastion(["bastion", "approve", quiet_id, "--queue-dir", str(queue)]).returncode == 0
        answer = client.answer(1)  # fails if a notice reached a request that did not opt in to log messages
        assert answer["result"]["content"][0]["text"] == "quiet"

        client.call(2, "raw__echo", {"text": "heard"}, meta={**envelope, "io.modelcontextprotocol/logLevel": "info"})
        notice = client.wait_notice(2)
        approval_id, command = _command_of(notice)
        assert run_bastion(command).returncode == 0
        assert client.answer(2)["result"]["content"][0]["text"] == "heard"

        client.call(3, "raw__echo", {"text": "progress"}, meta=envelope, progress_token="m-3")
        notice = client.wait_notice(3)
        assert notice["method"] == "notifications/progress" and notice["params"]["progressToken"] == "m-3"
        assert run_bastion(_command_of(notice)[1]).returncode == 0
        assert client.answer(3)["result"]["content"][0]["text"] == "progress"
    finally:
        client.close()


def test_a_withdrawn_call_withdraws_its_approval_request(tmp_path: Path) -> None:
    queue = str(tmp_path / "queue")
    client = Client(_raw_config(tmp_path), tmp_path / "stderr.log")
    try:
        client.initialize(LEGACY)
        client.call(1, "raw__echo", {"text": "never mind"})
        cancelled_id, command = _command_of(client.wait_notice(1))
        client.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
        assert _status_becomes(tmp_path, cancelled_id, "withdrawn")
        refused = run_bastion(command)
        assert refused.returncode != 0 and "withdrawn" in refused.stderr and cancelled_id in refused.stderr
        assert json.loads(run_bastion(["bastion", "approvals", "--json", "--queue-dir", queue]).stdout) == []

        # The client going away withdraws what it was waiting for too.
        client.call(2, "raw__echo", {"text": "leaving"})
        left_id, command = _command_of(client.wait_notice(2))
    finally:
        client.close()
    assert _status_becomes(tmp_path, left_id, "withdrawn")
    refused = run_bastion(command)
    assert refused.returncode != 0 and "withdrawn" in refused.stderr


def test_a_request_whose_gateway_is_gone_is_orphaned(tmp_path: Path) -> None:
    queue = str(tmp_path / "queue")
    client = Client(_raw_config(tmp_path), tmp_path / "stderr.log")
    try:
        client.initialize(LEGACY)
        client.call(1, "raw__echo", {"text": "lost"})
        orphan_id, command = _command_of(client.wait_notice(1))
        assert _record(tmp_path, orphan_id)["pid"] == client.proc.pid
        client.proc.send_signal(signal.SIGKILL)  # nothing of Bastion's runs to withdraw it
        client.proc.wait(timeout=30)
    finally:
        client.close()
    assert _record(tmp_path, orphan_id)["status"] == "pending"
    refused = run_bastion(command)
    assert refused.returncode != 0 and "orphaned" in refused.stderr and "no longer running" in refused.stderr
    assert json.loads(run_bastion(["bastion", "approvals", "--json", "--queue-dir", queue]).stdout) == []


def test_an_unanswered_approval_times_out_and_says_so(tmp_path: Path) -> None:
    client = Client(_raw_config(tmp_path, timeout_seconds=1.5), tmp_path / "stderr.log")
    try:
        client.initialize(LEGACY)
        client.call(1, "raw__echo", {"text": "too late"})
        approval_id, command = _command_of(client.wait_notice(1))
        refusal = client.answer(1)["error"]
        assert "timed out" in refusal["message"] and "1.5 s" in refusal["message"]
        assert "denied" not in refusal["message"]
    finally:
        _, stderr = client.close()
    assert _record(tmp_path, approval_id)["status"] == "expired"
    refused = run_bastion(command)
    assert refused.returncode != 0 and "timed out" in refused.stderr
    assert any("WARNING" in line and "timed out" in line for line in stderr.splitlines())


# --- prompts per session ----------------------------------------------------------------------------------


def _scratch(root: Path) -> tuple[Path, Path]:
    """A git repository and a folder with a file, like the demo's scratch data."""
    repo, files = root / "repo", root / "files"
    files.mkdir(parents=True)
    (files / "hello.txt").write_text("Hello.\n")
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("# Scratch\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost", "HOME": str(root)}
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "README.md"], ["git", "commit", "-q", "-m", "init"]):
        subprocess.run(argv, cwd=repo, env=env, check=True, capture_output=True)
    return repo, files


def _entries(repo: Path, files: Path) -> dict[str, dict]:
    """The demo's servers as a client's configuration names them."""
    return {
        "time": {"command": str(VENV_BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
        "git": {"command": str(VENV_BIN / "mcp-server-git"), "args": ["--repository", str(repo)]},
        "files": {"command": str(NODE_BIN / "mcp-server-filesystem"), "args": [str(files)]},
    }


def _session(repo: Path, files: Path) -> list[tuple[str, dict]]:
    """Ten calls a person might make in a short session: eight read, two write."""
    return [
        ("time__get_current_time", {"timezone": "UTC"}),
        ("time__convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"}),
        ("git__git_status", {"repo_path": str(repo)}),
        ("git__git_log", {"repo_path": str(repo)}),
        ("files__list_directory", {"path": str(files)}),
        ("files__read_text_file", {"path": str(files / "hello.txt")}),
        ("files__search_files", {"path": str(files), "pattern": "*.txt"}),
        ("files__write_file", {"path": str(files / "note.txt"), "content": "written through Bastion\n"}),
        ("files__create_directory", {"path": str(files / "more")}),
        ("git__git_diff_unstaged", {"repo_path": str(repo)}),
    ]


def _count_prompts(config: Path | None, calls: list[tuple[str, dict]], log: Path) -> tuple[list[str], list[dict]]:
    """Run the session, approving every call that waits with the command its notice gives; the names of the
    calls that waited for a person, and every answer."""
    client = Client(config, log)
    waited: list[str] = []
    answers: list[dict] = []
    try:
        client.initialize(LEGACY)
        # A server slower than ready_timeout joins after the first answer: list until every tool called is in.
        wanted = {name for name, _ in calls}
        deadline = time.monotonic() + 120
        for attempt in range(10_000):
            listed = client.request(f"list-{attempt}", "tools/list", {}, timeout=120)["result"]["tools"]
            names = {tool["name"] for tool in listed}
            # Past 10 tools the default exposure lists the search meta-tools instead: a call by name then waits for
            # its server itself.
            if wanted <= names or "search_tools" in names or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert wanted <= names or "search_tools" in names, sorted(names)
        for request_id, (name, arguments) in enumerate(calls, start=10):
            client.call(request_id, name, arguments)
            while True:
                message = client.recv(120)
                if message.get("id") == request_id and "method" not in message:
                    answers.append(message)
                    break
                if _is_wait_notice(message):
                    waited.append(name)
                    approved = run_bastion(_command_of(message)[1])
                    assert approved.returncode == 0, approved.stderr
    finally:
        client.close()
    return waited, answers


WRITES = ["files__write_file", "files__create_directory"]


def test_prompts_per_session_on_the_demo(tmp_path: Path, _state_in_tmp: Path) -> None:
    scratch = _state_in_tmp / "bastion" / "scratch"
    waited, answers = _count_prompts(None, _session(scratch / "repo", scratch / "files"), tmp_path / "demo.log")
    assert waited == WRITES  # the demo's servers are trusted: read-only calls run at once
    assert all("result" in a and not a["result"].get("isError") for a in answers), answers
    assert (scratch / "files" / "note.txt").read_text() == "written through Bastion\n"


def test_prompts_per_session_on_a_stock_file_and_once_reviewed(tmp_path: Path, _state_in_tmp: Path) -> None:
    repo, files = _scratch(tmp_path / "data")
    calls = _session(repo, files)
    stock = tmp_path / "claude_desktop_config.json"
    stock.write_text(json.dumps({"mcpServers": _entries(repo, files)}))
    waited, answers = _count_prompts(stock, calls, tmp_path / "stock.log")
    # Untrusted by default, but these are reference packages whose reads Bastion knows: only the writes ask.
    assert waited == WRITES
    assert all("result" in a and not a["result"].get("isError") for a in answers), answers
    (files / "note.txt").unlink()
    (files / "more").rmdir()

    # What `bastion import` writes for servers the user reviewed: their annotations are believed.
    reviewed_servers = {name: {**entry, "trust": "reviewed"} for name, entry in _entries(repo, files).items()}
    reviewed_servers["git"]["sandbox"] = {"writable": [str(repo)]}
    reviewed_servers["files"]["sandbox"] = {"writable": [str(files)]}
    reviewed = tmp_path / "reviewed.json"
    reviewed.write_text(json.dumps({"servers": reviewed_servers}))
    waited, answers = _count_prompts(reviewed, calls, tmp_path / "reviewed.log")
    assert waited == WRITES
    assert all("result" in a and not a["result"].get("isError") for a in answers), answers


def test_tools_the_client_file_approves_in_advance_do_not_ask(tmp_path: Path, _state_in_tmp: Path) -> None:
    repo, files = _scratch(tmp_path / "data")
    calls = _session(repo, files)
    entries = _entries(repo, files)
    entries["files"]["autoApprove"] = ["write_file"]
    entries["time"]["alwaysAllow"] = ["get_current_time", "convert_time"]
    stock = tmp_path / "cline_mcp_settings.json"
    stock.write_text(json.dumps({"mcpServers": entries}))
    waited, _ = _count_prompts(stock, calls, tmp_path / "stock.log")
    assert waited == ["files__create_directory"]  # the one write the file does not approve in advance
    records = [json.loads(line) for trail in (_state_in_tmp / "bastion").rglob("*.jsonl")
               for line in trail.read_text().splitlines()]
    in_advance = [r["what"]["target"] for r in records
                  if r.get("kind") == "decision" and r.get("rule") == "approval:client-config"]
    # The audit trail says who approved the write: the client's file (the time tools are reads, approved by nobody).
    assert in_advance == ["files__write_file"]
