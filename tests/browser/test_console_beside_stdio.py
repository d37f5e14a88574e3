"""``bastion console`` in a real Chromium beside a real ``bastion run`` that the official SDK's stdio client started,
in both protocol eras: the operator opens the printed login link, approves the agent's call that waits in the
approval queue (the client declares no elicitation; ``approver = "out_of_band"``), the agent's call completes, and
the audit page shows the approval as the console's identity, its chain intact across the two processes' chains."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.browser.waiting import SETTLE_MS, reload_until
from tests.support import BASTION, FIXTURES, READY_TIMEOUT

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")]


def _config(tmp: Path) -> Path:
    path = tmp / "bastion.json"
    path.write_text(json.dumps({
        "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "servers": {"kb": {"command": sys.executable, "args": [str(FIXTURES / "console_server.py")],
                           "sandbox": {"writable": [str(tmp)]}}},
        "policy": {"identity": {"name": "dana"}, "audit": {"path": str(tmp / "audit.jsonl")},
                   "approval": {"approver": "out_of_band", "queue_dir": str(tmp / "approvals"),
                                "poll_seconds": 0.1}}}))
    return path


async def _login_link(stderr: Path, process: subprocess.Popen) -> str:
    """The link ``bastion console`` prints on stderr once it listens (a file another process writes: read until
    the line is there)."""
    while not (found := re.search(r"open (http://127\.0\.0\.1:\d+/admin/login\?token=\S+)",
                                  stderr.read_text(errors="replace"))):
        assert process.poll() is None, stderr.read_text(errors="replace")
        await asyncio.sleep(0.05)
    return found.group(1)


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # 2025-11-25, and 2026-07-28 (auto discovers it)
async def test_approve_a_stdio_agents_call_in_the_console(context, tmp_path, mode) -> None:
    from playwright.async_api import expect

    config = _config(tmp_path)
    console_err = tmp_path / "console.stderr"
    console = subprocess.Popen([BASTION, "console", str(config)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=console_err.open("wb"))
    params = StdioServerParameters(command=BASTION, args=["run", str(config)])
    try:
        with (tmp_path / "run.stderr").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode=mode, read_timeout_seconds=120) as agent:
                call = asyncio.ensure_future(agent.call_tool("kb__remove", {"path": "/srv/stale.log"}))
                page = await context.new_page()
                await page.goto(await _login_link(console_err, console))
                await page.click("form.login button[type=submit]")
                await expect(page.locator("header .who")).to_contain_text("dana (console_link)")
                await page.goto(page.url.split("/admin/")[0] + "/admin/approvals")
                await reload_until(page, "tr", "/srv/stale.log")
                await expect(page.locator("tr", has_text="kb/remove")).to_contain_text("dana")
                await page.locator("tr", has_text="/srv/stale.log").locator("form.approve button").click()
                await expect(page.locator(".notice.ok")).to_contain_text("approved")
                result = await asyncio.wait_for(call, SETTLE_MS / 1000)
                assert result.content[0].text == "removed /srv/stale.log"

                await page.goto(page.url.split("/admin/")[0] + "/admin/audit?method=admin/approve")
                await expect(page.get_by_test_id("chain-state")).to_contain_text("Chain verified: intact")
                await expect(page.get_by_test_id("chain-state")).to_contain_text("2 chain(s)")  # run's and console's
                await expect(page.locator("table tbody tr").first).to_contain_text("dana")
    finally:
        console.send_signal(signal.SIGTERM)
        printed, _ = console.communicate(timeout=60)
    assert printed == b""  # what the console says is for people: stderr
