"""Logs of real gateway processes: ``--log-format json`` writes one JSON object a line on stderr, with the request's
facts on the lines written during it; neither format writes what a server or client sent unescaped."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from tests.observability.otlp_receiver import OtlpReceiver
from tests.observability.test_tracing import CLIENT_TRACE, CLIENT_TRACEPARENT, _config
from tests.support import BASTION, READY_TIMEOUT

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

DEADLINE = 120
# A server's stderr that would clear a terminal, rewrite a line and start lines of its own that read as Bastion's.
EVIL_STDERR = ("\\x1b[2Jcleared\\rbastion ERROR bastion: forged over\\n"
               "second\\u2028bastion ERROR bastion: forged after a separator\\n")
EVIL_SERVER = f"import sys; sys.stderr.write({EVIL_STDERR!r}.encode().decode('unicode_escape')); sys.exit(3)"


def _client(config: Path, errlog, *flags: str, mode: str = "legacy") -> Client:
    params = StdioServerParameters(command=BASTION, args=["run", str(config), *flags])
    return Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=DEADLINE)


def _json_lines(text: str) -> list[dict]:
    lines = text.splitlines()
    assert lines
    return [json.loads(line) for line in lines]  # every line is one JSON object, or this fails


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("tracing", [False, True])
async def test_json_lines_carry_the_facts_of_the_request_they_were_written_during(tmp_path, tracing, mode):
    with OtlpReceiver() as receiver:
        config, _ = _config(tmp_path, tracing={"otlp_endpoint": receiver.endpoint} if tracing else None)
        errors = tmp_path / "stderr.txt"
        with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
            async with _client(config, errlog, "--log-format", "json", mode=mode) as client:
                with pytest.raises(MCPError, match="refused by policy"):
                    await client.call_tool("raw__crash", {}, meta={"traceparent": CLIENT_TRACEPARENT})
    lines = _json_lines(errors.read_text())
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert lines[0]["time"].endswith("Z") and lines[0]["level"] in ("INFO", "WARNING")
    refusal = next(line for line in lines if line["message"].startswith("refused tools/call raw__crash"))
    assert refusal["logger"] == "bastion.policy" and refusal["level"] == "INFO"
    assert refusal["trace_id"] == CLIENT_TRACE
    assert refusal["server"] == "raw" and refusal["tool"] == "raw__crash" and refusal["identity"] == "local"
    assert refusal["request_id"] is not None
    # Lines written outside any request say nothing of one.
    assert not any("request_id" in line for line in lines if "ready" in line["message"])


def _evil_config(tmp_path: Path) -> Path:
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"evil": {"command": sys.executable, "args": ["-c", EVIL_SERVER]}},
                                  "policy": "off", "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"}}))
    return config


@pytest.mark.parametrize("log_format", ["human", "json"])
async def test_a_servers_stderr_is_escaped_in_either_format(tmp_path, log_format):
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog, anyio.fail_after(DEADLINE):
        async with _client(_evil_config(tmp_path), errlog, "-v", "--log-format", log_format) as client:
            await client.list_tools()  # the server has failed to start by now (ready_timeout waits for it)
    text = errors.read_text()
    assert "forged over" in text  # its stderr was logged
    assert "\x1b" not in text and "\r" not in text and "\u2028" not in text
    for line in text.split("\n"):
        assert not line.startswith("bastion ERROR bastion: forged"), line
    if log_format == "json":
        messages = [line["message"] for line in _json_lines(text)]
        assert any("\x1b[2Jcleared\rbastion ERROR" in message for message in messages)  # kept, as JSON escapes
    else:
        assert "\\x1b[2Jcleared\\rbastion ERROR" in text


@pytest.mark.parametrize("log_format", ["human", "json"])
def test_a_traceback_quoting_outside_text_is_escaped_too(log_format):
    """An exception's message may quote what a client or server sent: its traceback is escaped like the message."""
    from bastion.cli.conventions import RecordFormatter
    from bastion.observability.logs import JsonFormatter

    formatter = JsonFormatter() if log_format == "json" else RecordFormatter("bastion %(levelname)s %(name)s: %(message)s")
    try:
        raise ValueError("unknown tool '\x1b[2J'\nbastion ERROR bastion: forged")
    except ValueError:
        record = logging.LogRecord("bastion.frontend", logging.ERROR, __file__, 1, "internal error while serving %s",
                                   ("tools/call",), sys.exc_info())
    text = formatter.format(record)
    assert "\x1b" not in text and "ValueError" in text
    assert not any(line.startswith("bastion ERROR bastion: forged") for line in text.split("\n"))
    if log_format == "json":
        assert "\n" not in text and "forged" in json.loads(text)["exception"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_bastion_serve_writes_json_lines_with_the_trace_id_of_the_traceparent_header(tmp_path, mode):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from tests.http.conftest import IDENTITY_HEADER, serve_config, stop_bastion

    config, _ = _config(tmp_path, tracing=None)
    settings = json.loads(config.read_text())
    config.write_text(json.dumps({**settings, "http": {"identity_header": IDENTITY_HEADER}}))
    served = serve_config(config, tmp_path, tmp_path / "events.log", ("--log-format", "json"))
    try:
        headers = {"traceparent": CLIENT_TRACEPARENT, IDENTITY_HEADER: "alice"}
        with anyio.fail_after(DEADLINE):
            async with httpx2.AsyncClient(headers=headers, timeout=DEADLINE) as http:
                async with Client(streamable_http_client(served.url, http_client=http), mode=mode) as client:
                    with pytest.raises(MCPError, match="refused by policy"):
                        await client.call_tool("raw__crash", {})
    finally:
        stop_bastion(served)
    lines = _json_lines((tmp_path / "bastion.stderr").read_text())
    refusal = next(line for line in lines if line["message"].startswith("refused tools/call raw__crash"))
    assert (refusal["identity"], refusal["trace_id"], refusal["tool"]) == ("alice", CLIENT_TRACE, "raw__crash")
    assert any(line["message"].startswith("serving MCP on http://127.0.0.1:") for line in lines)
