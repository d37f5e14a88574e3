"""``bastion console`` beside a stdio deployment: a real ``bastion run`` started by the official SDK's stdio client,
and the console in a process of its own on 127.0.0.1. The login link it prints works once; the servers page shows
that gateway's servers, read from its status file; a retry from the page reaches that gateway (a crashing server,
fixed, comes back); the act is audited as the configuration's identity, logged in by the link; a request naming
another host is refused."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.console.support import POLICY, Browser, admin_records, gate_server
from tests.support import BASTION

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")]

DEADLINE = 120


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def _config(tmp: Path, servers: dict) -> Path:
    (tmp / "team.cedar").write_text(POLICY)
    path = tmp / "bastion.json"
    path.write_text(json.dumps({"servers": servers, "tools": {"exposure": "all"}, "ready_timeout": 60,
                                "policy": {"policy_files": ["team.cedar"], "identity": {"name": "ada"},
                                           "audit": {"path": str(tmp / "audit.jsonl")}}}))
    return path


class Console:
    """A running ``bastion console``: its process and the login link it printed."""

    def __init__(self, config: Path) -> None:
        self.stderr = config.parent / "console.stderr"
        self.process = subprocess.Popen([BASTION, "console", str(config)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=self.stderr.open("wb"))
        self.link = ""

    async def started(self) -> str:
        while not (found := re.search(r"open (http://127\.0\.0\.1:\d+/admin/login\?token=\S+)", self.log())):
            assert self.process.poll() is None, self.log()
            await asyncio.sleep(0.05)
        self.link = found.group(1)
        return self.link

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=60)
        return out.decode()


async def test_the_console_logs_in_once_by_its_link_and_shows_and_retries_the_stdio_gateways_servers(
        tmp_path, state) -> None:
    flags = tmp_path / "flags"
    fixed = flags / "settings.toml"
    config = _config(tmp_path, {"steady": gate_server("steady"),
                                "crashy": gate_server("crashy", flags, START_CRASH_UNLESS=str(fixed))})
    params = StdioServerParameters(command=BASTION, args=["run", str(config)])
    console = Console(config)
    try:
        with (tmp_path / "run.stderr").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy",
                              read_timeout_seconds=DEADLINE) as agent, httpx2.AsyncClient(timeout=60) as client:
                with anyio.fail_after(DEADLINE):
                    assert (await agent.call_tool("steady__hello", {})).content[0].text == "hello from steady"
                    link = await console.started()
                    base = link.split("/admin/")[0]
                    token = link.split("token=", 1)[1]

                    # the link's page changes nothing (a preview of the link spends nothing); its form logs in
                    shown = await client.get(link)
                    assert shown.status_code == 200 and f'value="{token}"' in shown.text
                    assert "set-cookie" not in shown.headers
                    browser = Browser(client, base)
                    first = await browser.post("/admin/login", {"token": token})
                    assert first.status_code == 303 and "HttpOnly" in first.headers["set-cookie"]
                    async with httpx2.AsyncClient(timeout=60) as other:
                        again = await Browser(other, base).post("/admin/login", {"token": token})
                        assert again.status_code == 403 and "used already" in again.text
                        assert "set-cookie" not in again.headers
                        rebound = await other.get(base + "/admin/servers", headers={"host": "evil.example"})
                        assert rebound.status_code == 403

                    while "when asked" not in (page := await browser.page("/admin/servers")).text:
                        await asyncio.sleep(0.1)
                    run_pid = next(p for p in os.listdir(state / "bastion" / "running") if p.endswith(".json"))
                    assert f"Gateway {run_pid.removesuffix('.json')}" in page.text
                    assert "steady" in page.text and "status-ready" in page.text and "settings file missing" in page.text
                    assert "ada (console_link)" in page.text

                    fixed.write_text("fixed")
                    done = await browser.act("retry_server", {"server": "crashy"})
                    assert done.status_code == 303
                    while "status-failed" in (await browser.page("/admin/servers")).text:
                        await asyncio.sleep(0.1)
                    assert (await agent.call_tool("crashy__hello", {})).content[0].text == "hello from crashy"
    finally:
        printed = console.stop()
    assert printed == ""  # what the console says is for people: stderr
    records = [r for r in admin_records(tmp_path) if r["what"]["method"] == "admin/retry_server"]
    assert [(r["who"]["name"], r["who"]["authenticated_by"], r["what"]["target"], r["outcome"]) for r in records] \
        == [("ada", "console_link", "crashy", 0)]
    # the console's chain and the gateway's are one trail, and it verifies
    verified = subprocess.run([BASTION, "audit", "verify", "--config", str(config)], capture_output=True, text=True,
                              timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_cedar_still_decides_what_the_console_link_may_do(tmp_path, state) -> None:
    config = _config(tmp_path, {})
    (tmp_path / "team.cedar").write_text(POLICY + '''
@id("no-retries-by-link")
forbid (principal, action == Bastion::Action::"administer", resource)
when { principal.authenticated_by == "console_link" && context.operation == "retry_server" };
''')
    console = Console(config)
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                link = await console.started()
                browser = Browser(client, link.split("/admin/")[0])
                assert (await browser.post("/admin/login", {"token": link.split("token=", 1)[1]})).status_code == 303
                assert (await browser.page("/admin/servers")).status_code == 200
                refused = await browser.act("retry_server", {"server": "anything"})
    finally:
        console.stop()
    assert refused.status_code == 403 and "no-retries-by-link" in refused.text
    [record] = [r for r in admin_records(tmp_path) if r["what"]["method"] == "admin/retry_server"]
    assert record["outcome"] == 403 and record["who"]["authenticated_by"] == "console_link"
