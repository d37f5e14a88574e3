"""FastMCP's client over Streamable HTTP through ``bastion serve``."""

from __future__ import annotations

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from tests.http.conftest import IDENTITY_HEADER, SERVER, Served


async def test_fastmcp_client_lists_and_calls(bastion_http: Served) -> None:
    transport = StreamableHttpTransport(bastion_http.url, headers={IDENTITY_HEADER: "fastmcp"})
    async with Client(transport, timeout=120) as client:
        tools = await client.list_tools()
        assert f"{SERVER}__test_simple_text" in {tool.name for tool in tools}
        result = await client.call_tool(f"{SERVER}__test_simple_text", {})
        assert result.content[0].text == "This is a simple text response for testing."
