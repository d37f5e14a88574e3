"""The older HTTP+SSE transport (2024-11-05) of a remote server: GET opens the event stream, whose ``endpoint``
event names where to POST (on the stream's own origin only); every answer comes back on the stream. With
``transport = "auto"`` a server that refuses the first Streamable HTTP POST with 404 or 405 is tried this way.

``LegacySse`` is a part of ``HttpTransport`` (bastion/transport/http_client.py), whose state it shares."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import httpx2

from bastion.protocol import jsonrpc
from bastion.transport.credentials import CredentialsError
from bastion.transport.http_events import (
    CONNECT_TIMEOUT,
    ConnectionDropped,
    describe,
    is_json,
    not_a_message,
    origin_of,
    shown,
)

if TYPE_CHECKING:
    from bastion.transport.http_client import HttpTransport


class LegacySse:
    """The HTTP+SSE wire of ``HttpTransport``."""

    async def _open_sse(self: "HttpTransport") -> None:
        """Open the event stream and wait for the ``endpoint`` event that says where to POST."""
        if self._endpoint_known.is_set():
            return
        if not any(task for task in self._background if task.get_name() == "sse-stream"):
            task = asyncio.get_running_loop().create_task(self._sse_stream(), name="sse-stream")
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        waiter = asyncio.ensure_future(self._endpoint_known.wait())
        done, _ = await asyncio.wait({waiter, self._ended}, timeout=CONNECT_TIMEOUT,
                                     return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not self._endpoint_known.is_set():
            reason = self._ended.result() if self._ended.done() else (
                f"its event stream sent no endpoint within {CONNECT_TIMEOUT:g}s")
            self._drop(reason)
            raise ConnectionDropped(reason)

    async def _sse_stream(self: "HttpTransport") -> None:
        try:
            async with self._stream_authorized("GET", self.url, headers={"accept": "text/event-stream"},
                                               timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=self._idle)) as response:
                if response.status_code >= 400:
                    self._drop(f"{self.url} answered the event stream's GET with HTTP {response.status_code}")
                    return
                async for event in httpx2.EventSource(response, max_event_size=self._max_bytes):
                    if event.event == "endpoint":
                        endpoint = urljoin(self.url, event.data.strip())
                        if origin_of(endpoint) != origin_of(self.url):
                            self._drop(f"its endpoint {endpoint} is not on {self.url}'s origin; refused")
                            return
                        self._endpoint = endpoint
                        self._endpoint_known.set()
                    elif event.event in ("message", "") and event.data:
                        data = event.data.encode("utf-8")
                        problem = not_a_message(data)
                        if problem is None:
                            self._on_frame(data)
                        else:
                            self._note(f"sent an event that is not a JSON-RPC message ({problem}), ignored: "
                                       f"{shown(data)}")
            self._drop("the server closed its event stream")
        except httpx2.ReadTimeout:
            self._drop(f"its event stream was silent for {self._idle:g}s")
        except httpx2.SSEError as exc:
            self._drop(f"its event stream broke: {exc}")
        except httpx2.TransportError as exc:
            self._drop(describe(exc, self.url))
        except CredentialsError as exc:
            self._drop(f"no credentials for its event stream: {exc}")

    async def _post_to_endpoint(self: "HttpTransport", frame: bytes, message: dict[str, Any], is_request: bool) -> None:
        await self._open_sse()
        assert self._endpoint is not None
        response = await self._send_authorized("POST", self._endpoint, content=frame,
                                               headers={"content-type": "application/json"})
        if response.status_code == 404:
            raise ConnectionDropped("the server no longer knows this connection's session (404)")
        if response.status_code >= 400 and is_request:
            if not (is_json(response) and self._deliver_error_body(response.content, message.get("id"))):
                self._answer_error(message.get("id"), jsonrpc.INTERNAL_ERROR,
                                   f"the server refused the message with HTTP {response.status_code}")
