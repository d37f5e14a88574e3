"""Debian's Chromium, headless, driven by Playwright's Python package: one browser per test module, stopped by the
fixture that started it.

No browser is downloaded: Playwright launches the system's ``chromium`` (setup installs it), so a missing one fails
the test with what to install rather than skipping it, since a skipped browser test would read as a passing console.
The browser reaches loopback only: every request to any other host is aborted, so a page that tried to load a
script or font from the network would show it broken here, as it would for an operator without the network.
"""

from __future__ import annotations

import os
import shutil
from typing import AsyncIterator

import pytest
import pytest_asyncio

CHROMIUM_NAMES = ("chromium", "chromium-browser")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def chromium_path() -> str:
    """Where Debian's Chromium is; fails (not skips) when it is missing, since `make setup` installs it."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("Debian's chromium is not installed (`apt-get install chromium`, which `make setup` does): the "
                "console's browser tests need it", pytrace=False)


def launch_arguments() -> list[str]:
    # Chromium refuses to start its sandbox as root (containers, CI runners): the pages it opens here are the
    # tests' own, served on loopback, so running them unsandboxed there risks nothing the sandbox would guard.
    return ["--no-sandbox"] if os.geteuid() == 0 else []


def loopback_only(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme in ("about", "data", "blob"):
        return True
    host = parts.hostname or ""
    return parts.scheme in ("http", "https", "ws", "wss") and (host in ("127.0.0.1", "localhost", "::1"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[object]:
    """A headless Chromium for the module's tests, closed when they are done."""
    from playwright.async_api import async_playwright

    path = chromium_path()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=path, headless=True, args=launch_arguments())
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser) -> AsyncIterator[object]:
    """A fresh browser context (its own cookies) per test, whose requests go nowhere but loopback."""
    made = await browser.new_context()
    blocked: list[str] = []

    async def only_loopback(route) -> None:
        if loopback_only(route.request.url):
            await route.continue_()
        else:
            blocked.append(route.request.url)
            await route.abort()

    await made.route("**/*", only_loopback)
    try:
        yield made
    finally:
        await made.close()
    assert not blocked, f"a page asked for something beyond loopback: {blocked}"
