"""A Python host API for applications that drive the model themselves.

    async with await Host.open("bastion.toml") as host:
        tools = await host.find_tools("convert a time between time zones", k=5)  # ready for a model's tool list
        result = await host.call_tool(tools[0]["name"], {...})

Everything goes through the same gateway as ``bastion run``: sandboxed servers, policy, audit.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from bastion.compose import build_gateway
from bastion.config import GatewayConfig, load_config
from bastion.gateway.core import Gateway
from bastion.model import GatewayError, GatewayRequest, Session

__all__ = ["Host", "GatewayError"]


class Host:
    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        # It finds tools itself (find_tools): the configured exposure mode, which is for MCP clients, passes it by.
        self._session = Session(gateway.identity, "legacy", "2025-11-25", {}, None, "host", finds_tools_itself=True)
        self._calls = 0

    @classmethod
    async def open(cls, config: str | os.PathLike[str] | GatewayConfig | None = None) -> "Host":
        """Start the configured servers (a file, a ``GatewayConfig``, or the demo configuration) and wait for each
        until it is ready or has failed to start within its own startup_timeout."""
        loaded = config if isinstance(config, GatewayConfig) else load_config(config)
        gateway = build_gateway(loaded)
        gateway.start({})
        await gateway.wait_started()
        return cls(gateway)

    async def __aenter__(self) -> "Host":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._gateway.close()

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool this identity may call, as MCP tool definitions."""
        result = await self._handle("tools/list", {})
        return list(result["tools"])

    async def find_tools(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` tools that best fit ``query`` among those this identity may call, best first."""
        index = await self._gateway.tool_index().current()
        # Described as listed now: the index ranks, but may not have caught up with a change yet.
        visible = {tool["name"]: tool for tool in await self.list_tools()}
        found = await index.search_async(query, k, allowed=visible.keys())
        return [dict(visible[name]) for name, _score in found]

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Call a tool by its federated name; policy refusals and server errors raise ``GatewayError``."""
        return await self._handle("tools/call", {"name": name, "arguments": dict(arguments or {})})

    async def _handle(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._calls += 1
        request = GatewayRequest(method, params, self._session, self._gateway.catalog, request_id=f"host-{self._calls}")
        return await self._gateway.handle(request)
