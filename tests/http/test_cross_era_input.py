"""Server-initiated input across the eras over HTTP: the official SDK's Streamable HTTP client of one era, through
``bastion serve``, to the SDK fixture server speaking the other. A 2026-07-28 client's POSTs stand alone, so the
retry that answers an ``input_required`` comes on a request of its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CreateMessageResult, ElicitResult, TextContent

from tests.http.conftest import SERVER, Served, serve_config, stop_bastion
from tests.support import FIXTURES, READY_TIMEOUT

DEADLINE = 180.0
LLM_ANSWER = "an answer sampled over HTTP"


def serve(tmp: Path, era: str) -> Served:
    events = tmp / "events.log"
    config = tmp / "bastion.json"
    config.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT, "servers": {SERVER: {
        "command": sys.executable, "args": [str(FIXTURES / "sdk_server.py")], "era": era,
        "env": {"FIXTURE_EVENTS": str(events)}, "request_timeout": 900, "sandbox": {"writable": [str(tmp)]}}}}))
    return serve_config(config, tmp, events)


async def on_sampling(context, params) -> CreateMessageResult:
    on_sampling.asked.append(params.messages[0].content.text)  # type: ignore[attr-defined]
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text=LLM_ANSWER), model="m")


async def on_elicitation(context, params) -> ElicitResult:
    return ElicitResult(action="accept", content={"response": "yes"})


@pytest.mark.parametrize("mode, era", [("2026-07-28", "legacy"), ("legacy", "modern")])
async def test_sampling_and_elicitation_cross_the_eras_over_http(tmp_path: Path, mode: str, era: str) -> None:
    served = serve(tmp_path, era)
    on_sampling.asked = []  # type: ignore[attr-defined]
    try:
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(120, read=300))
        client = Client(streamable_http_client(served.url, http_client=http), mode=mode,
                        sampling_callback=on_sampling, elicitation_callback=on_elicitation)
        with anyio.fail_after(DEADLINE):
            async with client:
                sampled = await client.call_tool(f"{SERVER}__test_sampling", {"prompt": "What is 2+2?"})
                elicited = await client.call_tool(f"{SERVER}__test_elicitation", {"message": "Proceed?"})
        texts = ["\n".join(b.text for b in r.content if isinstance(b, TextContent)) for r in (sampled, elicited)]
        assert texts[0] == f"LLM response: {LLM_ANSWER}"
        assert texts[1] == "User response: action=accept, content={'response': 'yes'}"
        assert on_sampling.asked == ["What is 2+2?"]  # type: ignore[attr-defined]
    finally:
        stop_bastion(served)
