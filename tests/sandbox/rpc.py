"""A minimal JSON-RPC-over-stdio client for driving servers started by ``bastion.sandbox.spawn``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bastion.sandbox import ServerProcess

PROTOCOL_VERSION = "2025-06-18"


class RpcClient:
    def __init__(self, process: ServerProcess) -> None:
        self.process = process
        self._next_id = 0

    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}}
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
            if not line:
                raise ConnectionError(f"server closed stdout ({self.process.termination_reason()})")
            reply = json.loads(line)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                return reply["result"]

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message = {"jsonrpc": "2.0", "method": method, "params": params or {}}
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def initialize(self) -> Any:
        result = await self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "bastion-sandbox-tests", "version": "0"},
        })
        await self.notify("notifications/initialized")
        return result

    async def call(self, tool: str, arguments: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """The tool's structured result (the malicious server returns JSON text in its first content item)."""
        result = await self.request("tools/call", {"name": tool, "arguments": arguments or {}}, timeout)
        return json.loads(result["content"][0]["text"])
