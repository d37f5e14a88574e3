"""Reading a remote server's event streams (SSE) over Streamable HTTP: a request's stream up to its answer, its
resumption with ``Last-Event-ID`` after the stream's ``retry:`` interval (2025-11-25 resumability), and a session's
GET stream of the server's own messages, reopened when it ends; and the checks and descriptions every part of the
HTTP client shares (a frame that is not a JSON-RPC message, a dropped connection said in words).

``EventStreams`` is a part of ``HttpTransport`` (bastion/transport/http_client.py): it reads the transport's state
(``url``, ``session_id``, ``is_open``, the idle timeout, the message limit) and hands frames up through it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx2
import orjson

from bastion.protocol import jsonrpc
from bastion.transport.credentials import CredentialsError
from bastion.transport.interface import TransportClosed

if TYPE_CHECKING:
    from bastion.transport.http_client import HttpTransport

CONNECT_TIMEOUT = 10.0
REOPEN_DELAY = 0.5  # before a server-message stream that ended is opened again
LONGEST_RETRY = 60.0  # a stream's ``retry:`` is obeyed up to this, so a server cannot park a request for hours
RESUMPTIONS = 5  # a request's stream resumed this many times in a row without a new event id has failed


class ConnectionDropped(TransportClosed):
    """The connection to the server is gone; the message says how."""


class StreamPosition:
    """Where an event stream got to: the last event id it named and the reconnection delay its ``retry:`` field
    asked for, which a resumption sends back as ``Last-Event-ID`` and waits out (2025-11-25 resumability)."""

    __slots__ = ("last_event_id", "retry")

    def __init__(self) -> None:
        self.last_event_id: str | None = None
        self.retry: float | None = None  # seconds

    def note(self, event: httpx2.ServerSentEvent) -> None:
        if event.id and "\0" not in event.id:
            self.last_event_id = event.id
        if event.retry is not None and event.retry >= 0:
            self.retry = min(event.retry / 1000, LONGEST_RETRY)

    def delay(self) -> float:
        return REOPEN_DELAY if self.retry is None else self.retry


def not_a_message(data: bytes) -> str | None:
    """Why ``data`` is not one JSON-RPC message, or None: a remote's garbage never reaches the session above."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return "not a JSON-RPC 2.0 object"
    return None


def shown(data: bytes) -> str:
    return repr(data[:200].decode("utf-8", "replace"))


def answers_request(data: bytes, request_id: Any) -> bool:
    """Whether an event is the answer to ``request_id`` (and not a notification or the server's own request)."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(message, dict) and "method" not in message and message.get("id") == request_id


def is_json(response: httpx2.Response) -> bool:
    return response.headers.get("content-type", "").partition(";")[0].strip().lower() == "application/json"


async def read_limited(response: httpx2.Response, limit: int) -> bytes | None:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def origin_of(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def describe(exc: httpx2.TransportError, url: str) -> str:
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect to {url}: {exc or type(exc).__name__}"
    if isinstance(exc, httpx2.TimeoutException):
        return f"{url} timed out ({type(exc).__name__})"
    return f"{url}: {type(exc).__name__}: {exc or 'connection reset'}"


class EventStreams:
    """The event-stream reading of ``HttpTransport``."""

    async def _read_events(self: "HttpTransport", response: httpx2.Response, request_id: Any, *, ends_with_answer: bool,
                           position: StreamPosition | None = None) -> bool:
        """Deliver a stream's messages; a request's stream is done with its answer. True when a request's stream
        ended cleanly without its answer after naming an event id in ``position``: the caller resumes it."""
        answered = False
        resumable = False
        try:
            async for event in httpx2.EventSource(response, max_event_size=self._max_bytes):
                if position is not None:
                    position.note(event)
                if event.event not in ("message", "") or not event.data:
                    continue  # a priming event, or one this protocol does not define
                data = event.data.encode("utf-8")
                problem = not_a_message(data)
                if problem is not None:
                    self._note(f"sent an event that is not a JSON-RPC message ({problem}), ignored: {shown(data)}")
                    continue
                if ends_with_answer and answers_request(data, request_id):
                    self._deliver(data, request_id)
                    answered = True
                    return False
                self._on_frame(data)
            resumable = ends_with_answer and position is not None and position.last_event_id is not None
            return resumable
        except httpx2.ReadTimeout:
            if ends_with_answer:
                raise
            return False  # a listen or GET stream silent past the idle timeout: reopened by the caller
        except httpx2.SSEError as exc:
            if ends_with_answer:
                self._answer_error(request_id, jsonrpc.INTERNAL_ERROR, f"its event stream broke: {exc}")
            return False
        finally:
            if ends_with_answer and not answered and not resumable and not self._ended.done() and not self._closing:
                if not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    self._answer_error(request_id, jsonrpc.UPSTREAM_UNAVAILABLE,
                                       "the server closed the request's stream without answering")

    async def _resume(self: "HttpTransport", request_id: Any, position: StreamPosition) -> None:
        """A request's stream closed before its answer: after the stream's retry interval, a GET with
        ``Last-Event-ID`` asks for what followed, until the answer comes (2025-11-25 resumability)."""
        fruitless = 0
        while fruitless < RESUMPTIONS:
            await asyncio.sleep(position.delay())
            if not self.is_open:
                return
            resumed_from = position.last_event_id
            assert resumed_from is not None
            headers = {"accept": "text/event-stream", "last-event-id": resumed_from}
            async with self._stream_authorized("GET", self.url, headers=headers,
                                               timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=self._idle)) as response:
                if response.status_code == 404 and self.session_id is not None:
                    raise ConnectionDropped("the server ended the session (404 for its Mcp-Session-Id)")
                content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
                if response.status_code >= 400 or content_type != "text/event-stream":
                    self._answer_error(request_id, jsonrpc.UPSTREAM_UNAVAILABLE,
                                       "the server closed the request's stream without answering and did not resume "
                                       f"it (HTTP {response.status_code} for a GET with Last-Event-ID)")
                    return
                if not await self._read_events(response, request_id, ends_with_answer=True, position=position):
                    return  # answered, or the failure was said
            fruitless = 0 if position.last_event_id != resumed_from else fruitless + 1
        self._answer_error(request_id, jsonrpc.UPSTREAM_UNAVAILABLE,
                           f"the server closed the request's stream without answering, {RESUMPTIONS} resumptions in "
                           "a row")

    # ----------------------------------------------------------------- the server's own messages (legacy)
    async def _get_stream(self: "HttpTransport") -> None:
        """After ``notifications/initialized``: the GET stream on which a session's server sends on its own,
        reopened after the stream's ``retry:`` interval with ``Last-Event-ID`` when it ends."""
        await asyncio.sleep(0)  # after the notification's POST has gone out
        position = StreamPosition()
        while self.is_open:
            headers = {"accept": "text/event-stream"}
            if position.last_event_id is not None:
                headers["last-event-id"] = position.last_event_id
            try:
                async with self._stream_authorized("GET", self.url, headers=headers,
                                                   timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=self._idle)) as response:
                    if response.status_code == 404 and self.session_id is not None:
                        self._drop("the server ended the session (404 for its Mcp-Session-Id)")
                        return
                    if response.status_code >= 400:
                        return  # 405: this server has no stream of its own messages
                    await self._read_events(response, None, ends_with_answer=False, position=position)
            except httpx2.ReadTimeout:
                pass  # silent past the idle timeout: a stream a proxy may have dropped unnoticed is opened again
            except httpx2.TransportError as exc:
                self._drop(describe(exc, self.url))
                return
            except CredentialsError:
                return  # no credentials now: the requests that need them say so; this stream is a convenience
            await asyncio.sleep(position.delay())
