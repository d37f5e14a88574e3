"""The web console in a real Chromium against a real ``bastion serve --http``: an operator logs in, watches a server
go down and come back, accepts a changed tool an agent then sees again, approves a waiting call the agent's SDK
client then sees complete, reads the acts in the audit view with its chain verified (and broken once a record is
edited), and a page of another loopback origin posting to the console is refused with nothing changed.

Each step waits on what settles it: Playwright's ``expect`` on the page, the SDK call's completion, the queue's
file; a page the server renders once is read again until it shows the change (``reload_until``).

With ``BASTION_SCREENSHOTS=DIR`` the main pages are saved as ``DIR/console-PAGE.png`` (docs/images holds them).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from mcp.shared.exceptions import MCPError

from bastion.policy.approval import ApprovalQueue
from tests.browser.gateway import SERVER, Gateway, start_gateway, stop_gateway
from tests.browser.waiting import SETTLE_MS, agent_lists, reload_until, screenshot, until

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="module")]

AWS_KEY = "AKIAIOSFODNN7REALKEY"  # the shape of an AWS access key id, not one that exists


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    served = start_gateway(tmp_path_factory.mktemp("console"), f"console-fixture-{os.getpid()}")
    try:
        yield served
    finally:
        stop_gateway(served)


@pytest_asyncio.fixture(loop_scope="module")
async def operator(context, gateway: Gateway) -> AsyncIterator[object]:
    """A page logged in to the console as the operator (group admins)."""
    page = await context.new_page()
    await log_in(page, gateway, gateway.admin_key)
    yield page


async def log_in(page, gateway: Gateway, credential: str) -> None:
    from playwright.async_api import expect

    await page.goto(f"{gateway.admin}/login")
    await page.fill("input[name=credential]", credential)
    await page.click("form.login button[type=submit]")
    await expect(page.locator("header .who")).to_contain_text("olga", timeout=SETTLE_MS)


async def test_log_in_and_who_may_not(context, gateway: Gateway) -> None:
    from playwright.async_api import expect

    page = await context.new_page()
    await page.goto(gateway.admin)
    await expect(page).to_have_url(f"{gateway.admin}/login")
    await page.fill("input[name=credential]", "bst_" + "A" * 43)
    await page.click("form.login button[type=submit]")
    await expect(page.locator(".notice.refused")).to_be_visible()
    await page.fill("input[name=credential]", gateway.agent_key)  # a valid key, of someone not in group admins
    await page.click("form.login button[type=submit]")
    await expect(page.locator(".notice.refused")).to_contain_text("agent-7 may not read the console")
    await log_in(page, gateway, gateway.admin_key)
    for title in ("Servers", "Approvals", "Audit trail", "Guardrails", "Live"):
        await expect(page.locator("header nav a", has_text=title)).to_be_visible()


async def test_a_server_goes_down_and_comes_back(operator, gateway: Gateway) -> None:
    from playwright.async_api import expect

    page = operator
    await page.goto(f"{gateway.admin}/servers")
    await reload_until(page, "tr .status-ready", "ready")
    await screenshot(page, "servers")
    gateway.stage_file.write_text("down")  # every start fails from now on, saying so on stderr
    gateway.kill_server()
    await reload_until(page, "tr", "failed")  # after its failed starts in a row, it is no longer started
    row = page.locator("tr", has_text=SERVER)
    await expect(row).to_contain_text("the stage file says down")  # its recent stderr
    gateway.stage_file.write_text("0")
    await row.locator("form button", has_text="Retry").click()
    await expect(page.locator(".notice.ok")).to_contain_text("asked gateway")
    await reload_until(page, "tr .status-ready", "ready")
    async with gateway.agent() as agent:
        result = await agent.call_tool(f"{SERVER}__lookup", {"term": "back"})
        assert result.content[0].text == "found back"


async def test_accept_a_changed_tool_and_the_agent_sees_it_again(operator, gateway: Gateway) -> None:
    from playwright.async_api import expect

    page = operator
    async with gateway.agent() as agent:
        assert f"{SERVER}__lookup" in {tool.name for tool in (await agent.list_tools()).tools}  # pinned as it is
    gateway.stage_file.write_text("1")  # the next start offers a lookup that asks for a scope, described anew
    gateway.kill_server()
    # The gateway compares the restarted server's tools with their pins when a client lists them; nothing tells a
    # client the restart happened, so the agent lists until the changed tool is withheld from it.
    await until(lambda: agent_lists(gateway), lambda names: f"{SERVER}__lookup" not in names)
    await page.goto(f"{gateway.admin}/changes")
    change = page.locator("section.change", has_text=f"{SERVER}/lookup")
    await expect(change.locator(".reasons")).to_contain_text("changed-definition")
    await expect(change.locator("pre.diff")).to_contain_text("Looks a term up in a scope you must name")
    await screenshot(page, "changes")
    await change.locator("form button", has_text="Accept").click()
    await expect(page.locator(".notice.ok")).to_contain_text("accepted 1 change")
    async with gateway.agent() as agent:
        tools = {tool.name: tool for tool in (await agent.list_tools()).tools}
        assert "scope" in tools[f"{SERVER}__lookup"].input_schema["required"]
        result = await agent.call_tool(f"{SERVER}__lookup", {"term": "x", "scope": "docs"})
        assert result.content[0].text == "found x in docs"


async def test_approve_a_waiting_call_from_the_page(operator, gateway: Gateway) -> None:
    from playwright.async_api import expect

    page = operator
    async with gateway.agent() as agent:
        call = asyncio.ensure_future(agent.call_tool(f"{SERVER}__remove", {"path": "/srv/old-report.txt"}))
        await page.goto(f"{gateway.admin}/approvals")
        row = page.locator("tr", has_text="kb/remove")
        await reload_until(page, "tr", "kb/remove")
        await expect(row).to_contain_text('"path": "/srv/old-report.txt"')
        await expect(row).to_contain_text("agent-7 (api_key)")
        assert not call.done()
        await screenshot(page, "approvals")
        await row.locator("form.approve button").click()
        await expect(page.locator(".notice.ok")).to_contain_text("approved")
        result = await asyncio.wait_for(call, SETTLE_MS / 1000)
        assert not result.is_error and result.content[0].text == "removed /srv/old-report.txt"
        await expect(page.locator("tr", has_text="kb/remove")).to_have_count(0)

        refused = asyncio.ensure_future(agent.call_tool(f"{SERVER}__remove", {"path": "/etc/important"}))
        await reload_until(page, "tr", "/etc/important")
        await page.locator("tr", has_text="/etc/important").locator("form.deny button").click()
        await expect(page.locator(".notice.ok")).to_contain_text("denied")
        with pytest.raises(MCPError, match="denied in the approval queue"):
            await asyncio.wait_for(refused, SETTLE_MS / 1000)

    async with gateway.agent(mode="auto") as modern:  # 2026-07-28: the call waits the same way, out of band
        call = asyncio.ensure_future(modern.call_tool(f"{SERVER}__remove", {"path": "/srv/modern.txt"}))
        await reload_until(page, "tr", "/srv/modern.txt")
        await page.locator("tr", has_text="/srv/modern.txt").locator("form.approve button").click()
        result = await asyncio.wait_for(call, SETTLE_MS / 1000)
        assert result.content[0].text == "removed /srv/modern.txt"


class _Forger(BaseHTTPRequestHandler):
    """Another loopback origin: a page whose form posts to the console as soon as it loads."""

    target = ""
    approval_id = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = (f'<!doctype html><form id=f method=post action="{self.target}">'
                f'<input name=approval_id value="{self.approval_id}"><input name=csrf value=guessed></form>'
                "<script>document.getElementById('f').submit()</script>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


async def test_a_page_of_another_origin_cannot_act(operator, context, gateway: Gateway) -> None:
    from playwright.async_api import expect

    queue = ApprovalQueue(gateway.folder / "approvals")
    async with gateway.agent() as agent:
        call = asyncio.ensure_future(agent.call_tool(f"{SERVER}__remove", {"path": "/tmp/forged"}))
        await operator.goto(f"{gateway.admin}/approvals")
        await reload_until(operator, "tr", "/tmp/forged")
        (waiting,) = queue.pending()
        _Forger.target, _Forger.approval_id = f"{gateway.admin}/act/approve", waiting.id
        forger = ThreadingHTTPServer(("127.0.0.1", 0), _Forger)
        threading.Thread(target=forger.serve_forever, daemon=True).start()
        try:
            page = await context.new_page()  # the operator's browser: its session cookie is there
            async with page.expect_response(f"{gateway.admin}/act/approve") as answered:
                await page.goto(f"http://127.0.0.1:{forger.server_address[1]}/")
            assert (await answered.value).status == 403
            await expect(page.locator(".notice.refused")).to_be_visible()
        finally:
            forger.shutdown()
            forger.server_close()
        assert queue.read(waiting.id).status == "pending" and not call.done()
        await operator.reload()
        await operator.locator("tr", has_text="/tmp/forged").locator("form.deny button").click()
        with pytest.raises(MCPError, match="denied in the approval queue"):
            await asyncio.wait_for(call, SETTLE_MS / 1000)


async def test_live_figures_and_guardrail_interventions(operator, gateway: Gateway) -> None:
    from playwright.async_api import expect

    page = operator
    await page.goto(f"{gateway.admin}/live")
    total = page.get_by_test_id("live-total")
    before = int(await total.text_content())
    async with gateway.agent() as agent:
        for _ in range(5):
            await agent.call_tool(f"{SERVER}__settings", {})
        leaked = await agent.call_tool(f"{SERVER}__settings", {})
    assert AWS_KEY not in leaked.content[0].text  # the secrets guardrail redacted the server's answer
    # The page's own script reads the figures again (no reload here): the count goes past the calls just made.
    await expect(total).not_to_have_text(str(before), timeout=SETTLE_MS)
    assert int(await total.text_content()) >= before + 6
    await expect(page.get_by_test_id("live-rate")).to_contain_text("requests/s")
    await expect(page.locator("#rate-line")).to_have_attribute("d", re.compile(r"^M"), timeout=SETTLE_MS)
    await screenshot(page, "live")

    await page.goto(f"{gateway.admin}/interventions")
    await expect(page.locator("tr", has_text="aws-access-key").first).to_contain_text("secrets")
    await expect(page.locator("tr", has_text="aws-access-key").last).to_contain_text("agent-7")
    assert AWS_KEY not in await page.content()
    await screenshot(page, "interventions")


async def test_the_audit_view_shows_the_acts_and_a_broken_chain(operator, gateway: Gateway) -> None:
    from playwright.async_api import expect

    page = operator
    await page.goto(f"{gateway.admin}/audit?method=admin/")
    await expect(page.get_by_test_id("chain-state")).to_contain_text("Chain verified: intact")
    records = page.locator("table tbody tr")
    await expect(records.filter(has_text="admin/approve").first).to_contain_text("olga")
    await expect(records.filter(has_text="admin/deny").first).to_be_visible()
    await screenshot(page, "audit")
    await page.goto(f"{gateway.admin}/audit?identity=agent-7&outcome=refused")
    await expect(records.filter(has_text="denied in the approval queue").first).to_contain_text("kb__remove")
    await expect(records.filter(has_text="olga")).to_have_count(0)

    # An editor changes who made a call, in place, while the gateway goes on writing the trail.
    with gateway.audit.open("r+b") as trail:
        data = trail.read()
        at = data.index(b'"name":"agent-7"')
        trail.seek(at)
        trail.write(b'"name":"agent-8"')
    await page.goto(f"{gateway.admin}/audit?identity=agent-8")
    await expect(page.get_by_test_id("chain-state")).to_contain_text("Chain BROKEN")
    await expect(page.get_by_test_id("chain-state")).to_contain_text("record was altered")
    await expect(records.filter(has_text="chain broken here")).to_have_count(1)
