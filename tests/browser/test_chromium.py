"""The browser fixture itself: Debian's Chromium starts headless through Playwright and renders a loopback page,
running its script; pages of the console are tested the same way (test_console_*.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from tests.browser.conftest import loopback_only

pytestmark = pytest.mark.browser

PAGE = b"<!doctype html><title>t</title><p id=out>static</p><script>out.textContent = 'scripted'</script>"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def loopback_page() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.asyncio(loop_scope="module")
async def test_chromium_renders_a_loopback_page_and_runs_its_script(context, loopback_page) -> None:
    from playwright.async_api import expect

    page = await context.new_page()
    await page.goto(loopback_page)
    await expect(page.locator("#out")).to_have_text("scripted")


def test_only_loopback_addresses_are_let_through() -> None:
    assert loopback_only("http://127.0.0.1:8080/admin") and loopback_only("http://localhost/x")
    assert loopback_only("http://[::1]:9/") and loopback_only("about:blank")
    assert not loopback_only("https://cdn.example.com/app.js")
    assert not loopback_only("http://127.0.0.1.example.com/")
    assert not loopback_only("file:///etc/passwd")


def test_a_missing_chromium_fails_saying_what_to_install(monkeypatch, tmp_path) -> None:
    from tests.browser.conftest import chromium_path

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium"):
        chromium_path()
