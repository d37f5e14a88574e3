"""Waiting in the browser tests on what settles a step, and the screenshots the docs show."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.browser.gateway import Gateway

SETTLE_MS = 60_000  # what one step may take at most on a busy machine; a step that passes returns at once
SCREENSHOTS = os.environ.get("BASTION_SCREENSHOTS")  # a folder: the main pages are saved there as console-PAGE.png


async def reload_until(page, selector: str, text: str, timeout_ms: int = SETTLE_MS) -> None:
    """Read a server-rendered page again until ``selector`` shows ``text`` (Playwright's own wait between reads)."""
    from playwright.async_api import expect

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    while True:
        try:
            await expect(page.locator(selector).filter(has_text=text).first).to_be_visible(timeout=500)
            return
        except AssertionError:
            if loop.time() > deadline:
                raise
            await page.reload()


async def agent_lists(gateway: Gateway) -> set[str]:
    async with gateway.agent() as agent:
        return {tool.name for tool in (await agent.list_tools()).tools}


async def until(read, holds, timeout_s: float = SETTLE_MS / 1000, every_s: float = 0.2):
    """Read again (``read``, a coroutine function) until ``holds`` says yes of what it read; for a change that no
    event announces to the reader, such as a server's restart to a client."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        seen = await read()
        if holds(seen):
            return seen
        if loop.time() > deadline:
            raise AssertionError(f"still {seen!r} after {timeout_s} s")
        await asyncio.sleep(every_s)


async def screenshot(page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        await page.set_viewport_size({"width": 1200, "height": 760})
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"console-{name}.png"))
