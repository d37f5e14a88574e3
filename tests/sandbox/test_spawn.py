"""spawn() and ServerProcess with real processes: environment, streams, exit reasons, shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from bastion.sandbox import SandboxConfig, SandboxError, spawn
from tests.sandbox.rpc import RpcClient

REPO = Path(__file__).parents[2]
DEFAULT = SandboxConfig()
NONE = SandboxConfig(profile="none")


async def run(command: str, args: list[str], config: SandboxConfig = DEFAULT, env: dict[str, str] | None = None,
              cwd: str | None = None) -> tuple[str, str, int, str | None]:
    process = await spawn("test", command, args, env or {}, cwd, config)
    process.stdin.close()
    out, err = await asyncio.gather(process.stdout.read(), process.stderr.read())
    status = await process.wait()
    await process.terminate()
    return out.decode(), err.decode(), status, process.termination_reason()


async def test_identity_inside_the_sandbox():
    out, _, status, _ = await run("/bin/sh", ["-c", "id -u; id -g; hostname; grep -E '^(CapEff|NoNewPrivs|Seccomp):' "
                                              "/proc/self/status; pwd"])
    lines = out.split()
    assert status == 0
    assert lines[:3] == ["65534", "65534", "mcp-sandbox"]
    assert "CapEff:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out
    assert lines[-1] == "/"


async def test_environment_is_cleared_then_filled_from_configuration(monkeypatch):
    monkeypatch.setenv("HOST_SECRET_TOKEN", "s3cret")
    monkeypatch.setenv("PASSED_THROUGH", "visible")
    config = SandboxConfig(env=("PASSED_THROUGH", "NOT_SET_ANYWHERE"))
    out, _, status, _ = await run("/usr/bin/env", [], config, env={"EXPLICIT": "given"})
    variables = dict(line.split("=", 1) for line in out.splitlines())
    assert status == 0
    assert "HOST_SECRET_TOKEN" not in variables
    assert variables["PASSED_THROUGH"] == "visible" and variables["EXPLICIT"] == "given"
    assert "NOT_SET_ANYWHERE" not in variables
    assert variables["LANG"] == "C.UTF-8" and "/usr/bin" in variables["PATH"]
    assert set(variables) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PWD", "PASSED_THROUGH", "EXPLICIT"}


async def test_profile_none_keeps_the_host_environment_and_warns_every_start(monkeypatch, caplog):
    monkeypatch.setenv("HOST_VARIABLE", "present")
    caplog.set_level(logging.WARNING, logger="bastion.sandbox")
    for _ in range(2):
        out, _, status, _ = await run("/usr/bin/env", [], NONE, env={"EXPLICIT": "given"})
        assert status == 0 and "HOST_VARIABLE=present" in out and "EXPLICIT=given" in out
    warnings = [r for r in caplog.records if "WITHOUT a sandbox" in r.getMessage()]
    assert len(warnings) == 2


async def test_bare_command_names_resolve_on_the_host_path():
    out, _, status, _ = await run("python3", ["-c", "print('hello from python')"])
    assert status == 0 and out.strip() == "hello from python"


async def test_unknown_command_is_a_clear_error():
    with pytest.raises(SandboxError, match="not found on PATH"):
        await spawn("test", "no-such-command-here", [], {}, None, DEFAULT)


async def test_missing_writable_grant_is_a_clear_error(tmp_path):
    config = SandboxConfig(writable=(str(tmp_path / "missing"),))
    with pytest.raises(SandboxError, match="sandbox.writable"):
        await spawn("test", "/bin/true", [], {}, None, config)


async def test_paths_named_in_arguments_are_readable_but_not_writable(tmp_path):
    data = tmp_path / "notes.txt"
    data.write_text("from the host")
    out, err, status, _ = await run("/bin/sh", ["-c", f"cat {data}; echo x >> {data} || echo refused", str(data)])
    assert "from the host" in out and "refused" in out, err
    assert data.read_text() == "from the host"


async def test_configured_working_directory(tmp_path):
    (tmp_path / "marker").write_text("here")
    out, _, status, _ = await run("/bin/sh", ["-c", "pwd; cat marker"], cwd=str(tmp_path))
    assert out.split() == [str(tmp_path), "here"]


async def test_exit_status_is_reported():
    for config in (DEFAULT, NONE):
        _, _, status, reason = await run("/bin/sh", ["-c", "exit 3"], config)
        assert status == 3 and reason == "exited with status 3"


async def test_death_by_signal_is_reported():
    for config in (DEFAULT, NONE):
        _, _, _, reason = await run("/bin/sh", ["-c", "kill -9 $$"], config)
        assert reason == "killed by signal 9"


async def test_memory_kill_is_reported_as_such():
    config = SandboxConfig(memory="64MiB")
    code = "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1"
    _, _, status, reason = await run(sys.executable, ["-c", code], config)
    assert reason == "killed: memory limit 64 MiB exceeded", (status, reason)


async def test_lines_of_tens_of_megabytes_pass_through_stdout():
    process = await spawn("test", sys.executable, ["-c", "import sys; sys.stdout.write('x' * 30_000_000 + '\\n')"],
                          {}, None, DEFAULT)
    line = await process.stdout.readline()
    assert len(line) == 30_000_001
    await process.terminate()


async def test_stdin_eof_ends_a_well_behaved_server_quickly():
    process = await spawn("test", "/bin/cat", [], {}, None, DEFAULT)
    process.stdin.write(b"echo\n")
    assert await process.stdout.readline() == b"echo\n"
    started = time.monotonic()
    await process.terminate(grace=5)
    assert time.monotonic() - started < 2 and process.termination_reason() == "exited with status 0"


@pytest.mark.parametrize("config", [DEFAULT, NONE], ids=["default", "none"])
async def test_sigterm_then_sigkill_for_servers_that_ignore_eof(config):
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('up', flush=True)\ntime.sleep(60)")
    process = await spawn("test", sys.executable, ["-c", stubborn], {}, None, config)
    assert await process.stdout.readline() == b"up\n"
    started = time.monotonic()
    await process.terminate(grace=0.3)
    assert 0.55 <= time.monotonic() - started < 5
    assert process.termination_reason() == "killed by signal 9"


@pytest.mark.parametrize("config", [DEFAULT, NONE], ids=["default", "none"])
async def test_sigterm_reaches_the_server(config):
    polite = "import sys, time\nprint('up', flush=True)\ntime.sleep(60)"  # default SIGTERM action: die
    process = await spawn("test", sys.executable, ["-c", polite], {}, None, config)
    assert await process.stdout.readline() == b"up\n"
    await process.terminate(grace=0.3)
    assert process.termination_reason() == "killed by signal 15"


@pytest.mark.parametrize("config", [DEFAULT, NONE], ids=["default", "none"])
async def test_a_server_that_closes_its_stdout_is_seen_to_at_once_though_it_runs_on(config):
    # Nothing but the server holds its stdout: not bubblewrap, not Bastion, not a spare copy in the server.
    closing = "import os, time\nprint('up', flush=True)\nos.close(1)\ntime.sleep(300)"
    process = await spawn("test", sys.executable, ["-c", closing], {}, None, config)
    try:
        assert await asyncio.wait_for(process.stdout.read(), 60) == b"up\n"  # read to the end of the stream
        assert process.returncode is None
    finally:
        await process.terminate(grace=0.3)
    assert process.termination_reason() == "killed by signal 15"


async def test_an_exit_is_seen_where_the_kernel_has_no_pidfds(monkeypatch):
    def no_pidfds(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    _, _, status, reason = await run("/bin/sh", ["-c", "exit 4"], NONE)
    assert status == 4 and reason == "exited with status 4"


async def test_terminate_is_idempotent_and_releases_everything():
    process = await spawn("test", "/bin/cat", [], {}, None, SandboxConfig(network=("127.0.0.1:9",)))
    limits, proxy, workdir = process._limits, process._proxy, process._workdir
    assert limits is not None and limits.dirs and os.path.isdir(workdir)
    assert proxy is not None and os.path.exists(proxy.socket_path)
    await process.terminate(grace=0.5)
    await process.terminate(grace=0.5)
    assert not any(os.path.exists(d) for d in limits.dirs) and not limits.dirs
    assert not os.path.exists(workdir) and not os.path.exists(proxy.socket_path)


async def test_a_real_server_answers_tools_list_in_the_sandbox():
    process = await spawn("time", str(REPO / ".venv/bin/mcp-server-time"), [], {}, None, DEFAULT)
    client = RpcClient(process)
    await client.initialize()
    tools = await client.request("tools/list")
    assert {tool["name"] for tool in tools["tools"]} >= {"get_current_time"}
    await process.terminate()


async def test_a_node_server_reads_only_its_granted_directory(tmp_path):
    binary = REPO / "node_modules" / ".bin" / "mcp-server-filesystem"
    if not binary.exists():
        pytest.skip("node_modules not installed")
    (tmp_path / "hello.txt").write_text("hi")
    process = await spawn("files", str(binary), [str(tmp_path)], {}, None, DEFAULT)
    client = RpcClient(process)
    await client.initialize()
    listing = await client.request("tools/call", {"name": "list_directory", "arguments": {"path": str(tmp_path)}})
    assert "hello.txt" in listing["content"][0]["text"]
    refused = await client.request("tools/call", {"name": "write_file",
                                                  "arguments": {"path": str(tmp_path / "new.txt"), "content": "x"}})
    assert refused.get("isError") and not (tmp_path / "new.txt").exists()
    await process.terminate()


async def test_missing_working_directory_is_a_clear_error():
    with pytest.raises(SandboxError, match="working directory /no/such/dir does not exist"):
        await spawn("test", "/bin/true", [], {}, "/no/such/dir", DEFAULT)


async def test_bwrap_setup_failure_surfaces_its_message(tmp_path, monkeypatch):
    """A granted path that vanishes between planning and bwrap's setup: bwrap's own error is reported."""
    from bastion.sandbox import process as process_module

    vanishing = tmp_path / "vanishing"
    vanishing.mkdir()
    plan = process_module.plan_sandbox

    def plan_then_remove(*args, **kwargs):
        result = plan(*args, **kwargs)
        vanishing.rmdir()
        return result

    monkeypatch.setattr(process_module, "plan_sandbox", plan_then_remove)
    with pytest.raises(SandboxError, match="Can't find source path"):
        await spawn("test", "/bin/true", [], {}, None, SandboxConfig(read_only=(str(vanishing),)))
