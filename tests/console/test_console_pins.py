"""The catalog and the pending tool changes on a real ``bastion serve --http``: every tool with its token cost and pin
state, hostile markup from a server (a description with a script, an attribute breaker, a javascript: link, stderr
lines alike) shown escaped; a rug pull withheld with its reasons and a readable diff, rejected (it stays withheld)
and then accepted from the console, after which the agent's own SDK client sees the tool again."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.auth.serving import stop
from tests.console.support import Browser, admin_records, base_of, serve_with_keys
from tests.support import FIXTURES

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")]

DEADLINE = 120
HOSTILE = str(FIXTURES / "hostile_tools_server.py")
RUG = str(FIXTURES / "rug_pull_server.py")
RAW_MARKUP = ("<script>", 'onerror="alert', 'href="javascript:')


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


async def _until(browser: Browser, path: str, predicate) -> httpx2.Response:
    while True:
        response = await browser.page(path)
        if predicate(response.text):
            return response
        await asyncio.sleep(0.1)


async def test_the_catalog_shows_token_costs_and_pin_states_and_escapes_what_servers_say(tmp_path, state) -> None:
    served, admin, guest = serve_with_keys(tmp_path, {"hostile": {"command": sys.executable, "args": [HOSTILE]}})
    try:
        agent_http = httpx2.AsyncClient(headers={"authorization": f"Bearer {guest}"}, timeout=120)
        async with httpx2.AsyncClient(timeout=60) as client, \
                Client(streamable_http_client(served.url, http_client=agent_http), mode="legacy") as agent:
            with anyio.fail_after(DEADLINE):
                # what an agent is first shown is pinned (the scan's finding withholds it all the same)
                assert "hostile__peek" not in {t.name for t in (await agent.list_tools()).tools}
                browser = Browser(client, base_of(served))
                assert (await browser.login(admin)).status_code == 303
                catalog = await _until(browser, "/admin/catalog", lambda text: "hostile__peek" in text)
                servers = await _until(browser, "/admin/servers", lambda text: "starting " in text)
                changes = await browser.page("/admin/changes")
    finally:
        stop(served)
    for page in (catalog, servers, changes):
        assert page.status_code == 200
        for raw in RAW_MARKUP:
            assert raw not in page.text, (raw, page.text)
    assert "&lt;script&gt;alert(&#x27;description&#x27;)&lt;/script&gt;" in catalog.text
    assert "&lt;a href=&quot;javascript:alert(&#x27;link&#x27;)&quot;&gt;" in catalog.text
    assert "&quot;&gt;&lt;img src=x onerror=&quot;alert(&#x27;title&#x27;)&quot;&gt;" in servers.text
    # its cost in tokens, and pinned on first use
    cost = catalog.text.split("hostile__peek", 1)[1].split("</tr>", 1)[0]
    assert "<td>hostile</td>" in cost and "<span>pinned 20" in cost
    assert any(cell.isdigit() and int(cell) > 20 for cell in
               (part.split("</td>", 1)[0].replace(",", "") for part in cost.split("<td>")))
    # the metadata scan's finding is a reason the tool is withheld, and no accept lifts it
    assert "hostile/peek" in changes.text and "injection" in changes.text
    assert "Accepting does not lift" in changes.text


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_changed_tool_is_shown_with_its_reasons_rejected_then_accepted_and_served_again(
        tmp_path, state, mode) -> None:
    # handshake era: its announcement comes before its answer, so the list after it shows the change
    rug = {"command": sys.executable, "args": [RUG], "trust": "reviewed", "era": "legacy"}
    served, admin, guest = serve_with_keys(tmp_path, {"rug": rug},
                                           guardrails={"servers": {"rug": {"metadata_injection": "off"}}})
    try:
        agent_http = httpx2.AsyncClient(headers={"authorization": f"Bearer {guest}"},
                                        timeout=httpx2.Timeout(120, read=300))
        async with Client(streamable_http_client(served.url, http_client=agent_http), mode=mode) as agent, \
                httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                assert "rug__add" in {t.name for t in (await agent.list_tools()).tools}
                await agent.call_tool("rug__advance", {})
                assert "rug__add" not in {t.name for t in (await agent.list_tools()).tools}

                browser = Browser(client, base_of(served))
                assert (await browser.login(admin)).status_code == 303
                page = await _until(browser, "/admin/changes", lambda text: "rug/add" in text)
                section = page.text.split("rug/add (tool)", 1)[1].split("</section>", 1)[0]
                assert "changed-definition" in section and "new required parameter" in section
                assert "&lt;IMPORTANT&gt;" in section and "<IMPORTANT>" not in section
                assert '-  &quot;description&quot;: &quot;Adds two numbers&quot;,' in section  # the diff

                rejected = await browser.act("reject_tool_change", {"configuration": str(tmp_path / "bastion.json"),
                                                                    "server": "rug", "name": "add"}, back="changes")
                assert rejected.status_code == 303
                after = await browser.page("/admin/changes")
                assert "rejected rug/add: it stays withheld" in after.text and "Rejected by ada" in after.text
                assert "rug__add" not in {t.name for t in (await agent.list_tools()).tools}

                accepted = await browser.act("accept_tool_change", {"configuration": str(tmp_path / "bastion.json"),
                                                                    "server": "rug", "name": "add"}, back="changes")
                assert accepted.status_code == 303
                assert "accepted 1 change (rug/add)" in (await browser.page("/admin/changes")).text
                # the agent's next list has it again, as accepted
                tools = {t.name: t for t in (await agent.list_tools()).tools}
                assert "rug__add" in tools and "<IMPORTANT>" in (tools["rug__add"].description or "")
    finally:
        stop(served)
    records = {(r["what"]["method"], r["what"].get("target"), r["outcome"], r["who"]["name"])
               for r in admin_records(tmp_path)}
    assert ("admin/reject_tool_change", "rug/add", 0, "ada") in records
    assert ("admin/accept_tool_change", "rug/add", 0, "ada") in records
