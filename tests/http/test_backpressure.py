"""A per-server bound on requests in flight (calls, prompts, reads, completions): past it a request is refused at
once with -32000 and retryAfterSeconds."""

from __future__ import annotations

import asyncio
import time

import httpx2

from tests.http.conftest import SERVER, start_bastion, stop_bastion
from tests.http.test_sdk_clients import MODERN_META


async def test_a_full_server_refuses_calls_with_retry_after(tmp_path) -> None:
    served = start_bastion(tmp_path, {"max_in_flight_per_server": 2, "retry_after_seconds": 3})
    try:
        async with httpx2.AsyncClient(timeout=300) as http:
            def post(method: str, name: str | None, request_id: str, params: dict):
                headers = {"content-type": "application/json", "accept": "application/json",
                           "mcp-protocol-version": "2026-07-28", "mcp-method": method}
                if name is not None:
                    headers["mcp-name"] = name
                return http.post(served.url, headers=headers, json={"jsonrpc": "2.0", "id": request_id,
                                 "method": method, "params": {**params, "_meta": MODERN_META}})

            slow = f"{SERVER}__test_slow_cancellable"
            listed = await post("tools/list", None, "list", {})  # the catalog knows the server's tools from here
            assert slow in {tool["name"] for tool in listed.json()["result"]["tools"]}
            calls = [asyncio.ensure_future(post("tools/call", slow, f"busy-{i}", {"name": slow, "arguments": {
                "tag": f"busy-{i}"}})) for i in range(2)]
            deadline = time.monotonic() + 120
            while sum(line.startswith("slow-started busy-") for line in served.events.read_text().splitlines()) < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            refused = await post("tools/call", slow, "busy-3", {"name": slow, "arguments": {"tag": "busy-3"}})
            assert refused.status_code == 200 and refused.headers["retry-after"] == "3"
            error = refused.json()["error"]
            assert error["code"] == -32000 and error["data"] == {"retryAfterSeconds": 3}
            # Every request forwarded to that server counts, not only calls; the gateway's own answers do not.
            prompt = f"{SERVER}__test_simple_prompt"
            for method, name, params in [
                    ("prompts/get", prompt, {"name": prompt}),
                    ("resources/read", "test://static-text", {"uri": "test://static-text"}),
                    ("completion/complete", None, {"ref": {"type": "ref/prompt", "name": f"{SERVER}__test_prompt_"
                                                           "with_arguments"}, "argument": {"name": "arg1", "value": "p"}})]:
                refused = await post(method, name, f"busy-{method}", params)
                assert refused.headers["retry-after"] == "3", (method, refused.text)
                error = refused.json()["error"]
                assert error["code"] == -32000 and error["data"] == {"retryAfterSeconds": 3}, method
                assert "2 requests in flight" in error["message"] and "max_in_flight_per_server" in error["message"]
            listed = await post("tools/list", None, "list-again", {})
            assert slow in {tool["name"] for tool in listed.json()["result"]["tools"]}
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            simple = f"{SERVER}__test_simple_text"
            while True:  # the slots come back once the callers have gone
                ok = await post("tools/call", simple, "after", {"name": simple, "arguments": {}})
                if "result" in ok.json():
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            assert ok.json()["result"]["content"][0]["text"].startswith("This is a simple text")
            # A prompt, a read and a completion give their slots back when answered: more of them than the bound pass.
            for turn in range(3):
                got = await post("prompts/get", prompt, f"prompt-{turn}", {"name": prompt})
                assert "messages" in got.json()["result"], got.text
                read = await post("resources/read", "test://static-text", f"read-{turn}", {"uri": "test://static-text"})
                assert read.json()["result"]["contents"][0]["uri"] == "test://static-text", read.text
    finally:
        stop_bastion(served)
