"""One remote MCP server over HTTP: Streamable HTTP in both eras, and the older HTTP+SSE transport.

The transport moves frames and nothing else: the upstream session above it sends the same JSON-RPC frames it sends
a local server and gets the server's frames back, whatever carried them. What HTTP adds is handled here and in the
modules beside it (the headers: ``http_headers.py``; reading event streams: ``http_events.py``; HTTP+SSE:
``http_sse.py``):

- **Streamable HTTP, 2026-07-28**: every request is its own POST carrying ``MCP-Protocol-Version``, ``Mcp-Method``
  and ``Mcp-Name`` (mirrored from the body), and ``Mcp-Param-*`` for the arguments a tool's schema marks
  ``x-mcp-header`` (learnt from the ``tools/list`` answers that pass through); the answer is JSON, or an SSE stream scoped to the request that may
  carry its progress first. There are no client notifications on this wire: a cancellation closes the request's
  own stream instead. ``subscriptions/listen`` is a POST whose stream stays open; it is reopened if it ends or
  goes silent.
- **Streamable HTTP, 2025-11-25 and before**: the ``Mcp-Session-Id`` the server gives with its ``initialize``
  answer goes on every later request, with the negotiated version; after ``notifications/initialized`` a GET
  stream carries the server's own messages; DELETE ends the session at close. A 404 on a session is the server
  having forgotten it: the connection is over and the upstream reconnects with a new handshake. An event stream
  the server closes (the GET one, or a request's before its answer) is reopened after its ``retry:`` interval with
  ``Last-Event-ID``, so the server can send what followed (resumability).
- **HTTP+SSE (2024-11-05)**: GET opens the event stream, whose ``endpoint`` event names where to POST; every answer
  comes back on the stream. With ``transport = "auto"`` a server that refuses the first POST with 404 or 405 is
  tried this way, as the specification asks of clients.

A dropped connection (refused, reset, a stream silent past its idle timeout) ends the whole transport at once with
the reason, so the calls waiting on it fail at once rather than each at its timeout, and the upstream reconnects
with backoff. The headers sent are the configuration's and the protocol's, never anything a client sent Bastion.

Credentials (``UpstreamCredentials``, bastion/credentials) are asked for their headers before every request, so a
token refreshed or revoked meanwhile is what goes out next; a 401 or 403 is shown to them (``refused``), and when
they say new credentials were obtained (a refresh, a step-up of scopes) the request is sent once more, never more.
On Bastion's own connection (credentials with ``resend_when_authorized``), whose authorization link only the log
shows, a request refused pending an authorization waits for it and is sent once more when it completes (or is
given up at its own timeout): the catalog's list that a re-authorization interrupted is not lost.
When none can be had the request is answered with an error saying what the user must do; with a link to follow it
is the URL-elicitation-required error (-32042) whose data names the link, so a client that can open it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Sequence

import httpx2
import orjson

from bastion import __version__
from bastion.protocol import jsonrpc
from bastion.transport.credentials import URL_ELICITATION_REQUIRED, CredentialsError, UpstreamCredentials, url_elicitation
from bastion.transport.http_events import (
    CONNECT_TIMEOUT,
    REOPEN_DELAY,
    ConnectionDropped,
    EventStreams,
    StreamPosition,
    describe,
    is_json,
    not_a_message,
    read_limited,
    shown,
)
from bastion.protocol.mirrored_headers import annotated_params
from bastion.transport.http_headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER, mirrored_headers
from bastion.transport.http_sse import LegacySse
from bastion.transport.spki import PinnedTransport
from bastion.transport.interface import DIAGNOSTICS_KEPT, StartRefused, UpstreamReceiver

if TYPE_CHECKING:
    from bastion.config import ServerConfig

log = logging.getLogger("bastion.transport.http")
# httpx2 logs every request at INFO: one line per call drowns what Bastion says about its servers.
for _chatty in ("httpx2", "httpcore2"):
    logging.getLogger(_chatty).setLevel(logging.WARNING)

_CLOSE_TIMEOUT = 2.0  # the DELETE that ends a session: a courtesy, never a reason to hold Bastion's exit
_STABLE_STREAM = 5.0  # a listen stream that lived this long is reopened after the shortest delay
_LISTEN = "subscriptions/listen"
_HANDSHAKES = ("initialize", "server/discover")  # requests Bastion sends for itself when a connection starts
_REFUSED = (401, 403)  # the statuses credentials are shown, to refresh or step up before the one retry


def _has_http2() -> bool:
    try:
        import h2  # noqa: F401  - httpx2 negotiates HTTP/2 (by ALPN, over TLS) only when h2 is installed
    except ImportError:
        return False
    return True


# Imported from here by those who use them: the credentials' error code and the header helpers.
__all__ = ["URL_ELICITATION_REQUIRED", "ConnectionDropped", "HttpTransport", "StreamPosition"]


class HttpTransport(EventStreams, LegacySse):
    """Frames to and from one remote server: an ``UpstreamTransport`` (bastion/transport/upstream.py), one attempt.

    ``start()`` connects (for HTTP+SSE: opens the stream and waits for its endpoint); ``send(frame)`` never blocks;
    ``ended()`` says why the connection dropped; ``close()`` ends it (DELETE for a session).
    """

    def __init__(
        self,
        name: str,
        url: str,
        headers: Mapping[str, str],
        *,
        kind: str = "auto",
        max_message_bytes: int = jsonrpc.DEFAULT_MAX_MESSAGE_BYTES,
        sse_idle_timeout: float = 60.0,
        ca_file: str | None = None,
        client: httpx2.AsyncClient | None = None,
        credentials: UpstreamCredentials | None = None,
        client_cert: tuple[str, str | None] | None = None,
        pinned_public_keys: Sequence[str] = (),
    ) -> None:
        if kind not in ("auto", "streamable-http", "sse"):
            raise ValueError(f"unknown HTTP transport {kind!r}")
        self.name = name
        self.url = url
        self.kind = kind  # "auto" until the server's first answer settles it
        self._static_headers = {"user-agent": f"bastion/{__version__}", **dict(headers)}
        self._credentials = credentials
        self._awaiting_authorization: set[Any] = set()  # requests held until an authorization completes
        self._receiver: UpstreamReceiver | None = None
        self._notes: deque[str] = deque(maxlen=DIAGNOSTICS_KEPT)
        self._max_bytes = max_message_bytes
        self._idle = sse_idle_timeout
        self._own_client = client is None
        # A private CA replaces the system's trust store for this server only; the certificate is still checked.
        verify: ssl.SSLContext | bool = True
        self._refused: str | None = None  # a configuration no retry mends, said when the start is refused
        if ca_file:
            try:
                verify = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                self._refused = f"its ca_file {ca_file} cannot be used: {exc}"
        if client_cert is not None and self._refused is None:
            # mutual TLS: Bastion's own certificate, for a server that asks for one
            context = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
            try:
                context.load_cert_chain(*client_cert)
                verify = context
            except (OSError, ssl.SSLError) as exc:
                self._refused = f"its client_cert {client_cert[0]} cannot be used: {exc}"
        limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20)
        # A pinned server is reached directly: a proxy from the environment would get a transport without the pins.
        pinned = PinnedTransport(name, pinned_public_keys, verify=verify, http2=_has_http2(), limits=limits) \
            if pinned_public_keys else None
        self._client = client or httpx2.AsyncClient(
            http2=_has_http2(), follow_redirects=False, verify=verify,
            timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=None), limits=limits, transport=pinned,
            trust_env=pinned is None)
        self.session_id: str | None = None
        self.protocol_version: str | None = None  # the legacy version negotiated by initialize
        self._legacy = False  # an initialize went out: the stateful wire, where notifications are POSTed too
        self._initialize_id: Any = None
        self._posts: dict[Any, asyncio.Task[None]] = {}  # request id -> its POST (and its response stream)
        self._listing: set[Any] = set()  # ids of tools/list requests in flight, whose answers say which headers
        # Per tool (the server's name), its arguments mirrored as Mcp-Param-* headers (x-mcp-header, 2026-07-28).
        self._param_headers: dict[str, dict[tuple[str, ...], str]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._endpoint: str | None = None  # HTTP+SSE: where messages are POSTed
        self._endpoint_known = asyncio.Event()
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._closing = False
        self._listen_delay = REOPEN_DELAY

    @classmethod
    def for_server(cls, name: str, config: "ServerConfig", *, max_message_bytes: int,
                   credentials: UpstreamCredentials | None = None) -> "HttpTransport":
        assert config.url is not None
        return cls(name, config.url, config.headers, kind=config.transport, max_message_bytes=max_message_bytes,
                   sse_idle_timeout=config.sse_idle_timeout, ca_file=config.ca_file, credentials=credentials,
                   client_cert=(config.client_cert, config.client_key) if config.client_cert else None,
                   pinned_public_keys=config.pinned_public_keys)

    # --------------------------------------------------------------------------------------- lifecycle
    async def ended(self) -> str:
        """Why the connection dropped (or "closed")."""
        return await asyncio.shield(self._ended)

    def refusal(self) -> str | None:
        return None  # a URL that does not answer today may tomorrow: every failure is retried with backoff

    def diagnostics(self) -> list[str]:
        return list(self._notes)

    @property
    def is_open(self) -> bool:
        return not self._ended.done() and not self._closing

    async def start(self, receiver: UpstreamReceiver) -> None:
        if self._refused is not None:
            raise StartRefused(self._refused)
        self._receiver = receiver
        if self.kind == "sse":
            await self._open_sse()

    def _on_frame(self, frame: bytes) -> None:
        if self._receiver is not None:
            self._receiver.frames_received((frame,))

    async def close(self) -> None:
        self._closing = True
        tasks = [*self._posts.values(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.session_id is not None and self.kind == "streamable-http":
            try:
                await self._client.delete(self.url, headers=await self._sent_headers(), timeout=_CLOSE_TIMEOUT)
            except (httpx2.HTTPError, CredentialsError):
                pass
        if self._own_client:
            await self._client.aclose()
        if not self._ended.done():
            self._ended.set_result("closed")

    def _note(self, what: str) -> None:
        log.warning("server %s %s", self.name, what)
        self._notes.append(what)

    def _drop(self, reason: str) -> None:
        """The connection is gone: every request on it ends now, and the upstream hears why."""
        if self._ended.done() or self._closing:
            return
        log.debug("server %s: connection lost: %s", self.name, reason)
        self._notes.append(reason)
        self._ended.set_result(reason)
        for task in [*self._posts.values(), *self._background]:
            if task is not asyncio.current_task():
                task.cancel()

    def _spawn(self, coro: Any, request_id: Any = None) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        if request_id is None:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            self._posts[request_id] = task
            task.add_done_callback(lambda t, rid=request_id: self._posts.pop(rid, None) if self._posts.get(rid) is t
                                   else None)

    # -------------------------------------------------------------------------------------------- sending
    def backlog(self) -> int:
        return 0  # each request is a POST of its own; none waits in Bastion for the server to read it

    def send(self, frame: bytes) -> None:
        """Send one frame; its answer (and anything the server sends meanwhile) reaches ``on_frame``."""
        if not self.is_open:
            why = self._ended.result() if self._ended.done() else "closed"
            raise ConnectionDropped(f"server {self.name!r} is not reachable: {why}")
        message = orjson.loads(frame)
        if not isinstance(message, dict):
            raise ValueError("a frame to a remote server must be one JSON-RPC object")
        method = message.get("method")
        request_id = message.get("id") if method is not None else None
        is_request = method is not None and "id" in message
        if method == "initialize":
            self._legacy = True
            self._initialize_id = request_id
        elif method == "tools/list" and is_request:
            self._listing.add(request_id)
        if method is not None and not is_request and not self._legacy:
            self._notify_modern(method, message.get("params") or {})
            return
        if method == "notifications/cancelled":  # a request still waiting for an authorization is given up
            self._give_up_waiting((message.get("params") or {}).get("requestId"))
        self._spawn(self._post(frame, message, method, is_request), request_id if is_request else None)
        if method == "notifications/initialized" and self.kind != "sse":
            self._spawn(self._get_stream())  # the session's own messages (405: the server sends none)

    def _give_up_waiting(self, request_id: Any) -> None:
        task = self._posts.get(request_id) if request_id in self._awaiting_authorization else None
        if task is not None:
            task.cancel()

    def _notify_modern(self, method: str, params: Mapping[str, Any]) -> None:
        """The 2026-07-28 wire has no client notifications: a cancellation closes the request's own stream."""
        if method == "notifications/cancelled":
            task = self._posts.get(params.get("requestId"))
            if task is not None:
                task.cancel()

    def _headers(self, message: Mapping[str, Any] | None = None) -> dict[str, str]:
        headers = dict(self._static_headers)
        if self.session_id is not None:
            headers[SESSION_HEADER] = self.session_id
        if self.protocol_version is not None:
            headers[PROTOCOL_VERSION_HEADER] = self.protocol_version
        if message is not None:
            mirrored_headers(headers, message, self._param_headers)
        return headers
    async def _sent_headers(self, message: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The protocol's headers and the credentials' current ones (asked anew for every request, so a refreshed
        token goes out at once). Raises ``CredentialsError`` when the credentials have none to give."""
        headers = self._headers(message)
        if self._credentials is not None:
            headers.update(await self._credentials.headers())
        return headers

    async def _send_authorized(self, method: str, url: str, message: Mapping[str, Any] | None = None, *,
                               stream: bool = False, **kwargs: Any) -> httpx2.Response:
        """One request with the credentials' headers; on 401 or 403 the credentials see the challenge, and when
        they obtained new ones the request goes once more with them (a second refusal is the answer)."""
        extra = kwargs.pop("headers", {})
        response = await self._client.send(
            self._client.build_request(method, url, headers={**await self._sent_headers(message), **extra}, **kwargs),
            stream=stream)
        if self._credentials is None or response.status_code not in _REFUSED:
            return response
        challenge = response.headers.get("www-authenticate")
        try:
            retry = await self._credentials.refused(response.status_code, challenge)
        except BaseException:
            await response.aclose()
            raise
        if not retry:
            return response
        await response.aclose()
        return await self._client.send(
            self._client.build_request(method, url, headers={**await self._sent_headers(message), **extra}, **kwargs),
            stream=stream)

    @contextlib.asynccontextmanager
    async def _stream_authorized(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx2.Response]:
        """``_send_authorized`` for a streamed answer, closed when the block ends."""
        response = await self._send_authorized(method, url, stream=True, **kwargs)
        try:
            yield response
        finally:
            await response.aclose()

    def _answer_unauthorized(self, request_id: Any, exc: CredentialsError, method: str | None = None) -> None:
        """No credentials for a request: the user is told what to do; a link to follow goes as the URL elicitation
        the specification defines for it (-32042), so a client that can open it does, and in the message for one
        that cannot. A handshake's answer is Bastion's own, logged as why the start failed: its message leaves the
        link out (a link is its user's alone; the credentials say where it went)."""
        if request_id is None:
            return
        message = f"server {self.name!r}: {exc}"
        if exc.link is None:
            error: dict[str, Any] = {"code": jsonrpc.INTERNAL_ERROR, "message": message}
        else:
            shown = message if method in _HANDSHAKES else f"{message}: {exc.link}"
            error = {"code": URL_ELICITATION_REQUIRED, "message": shown, "data": url_elicitation(exc.link, str(exc))}
        self._on_frame(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}))

    async def _post(self, frame: bytes, message: dict[str, Any], method: str | None, is_request: bool) -> None:
        try:
            try:
                await self._post_once(frame, message, method, is_request)
            except CredentialsError as exc:
                # Refused pending an authorization that only the log can ask for (Bastion's own connection): the
                # request waits for it and is sent once more, so what it was for (the catalog's list) is not lost.
                if not (is_request and method not in _HANDSHAKES
                        and await self._authorized_after(exc, message.get("id"))):
                    raise
                log.info("server %s: authorized; sending %s again", self.name, method)
                await self._post_once(frame, message, method, is_request)
        except asyncio.CancelledError:
            raise
        except CredentialsError as exc:
            self._answer_unauthorized(message.get("id") if is_request else None, exc, method)
        except httpx2.TransportError as exc:
            self._drop(describe(exc, self.url))
        except ConnectionDropped as exc:
            self._drop(str(exc))

    async def _post_once(self, frame: bytes, message: dict[str, Any], method: str | None, is_request: bool) -> None:
        if self.kind == "sse":
            await self._post_to_endpoint(frame, message, is_request)
        else:
            await self._post_streamable(frame, message, method, is_request)

    async def _authorized_after(self, exc: CredentialsError, request_id: Any) -> bool:
        """Whether a request refused with ``exc`` is worth sending again: its credentials hold the requests of
        nobody but Bastion (``resend_when_authorized``, which logged the link), the refusal names a link, and the
        authorization completed within the link's lifetime (the request's own timeout may end the wait first: it
        cancels the request). At most once per request: a second refusal is the answer."""
        wait = getattr(self._credentials, "resend_when_authorized", None)
        if exc.link is None or wait is None:
            return False
        self._awaiting_authorization.add(request_id)
        try:
            return await wait()
        finally:
            self._awaiting_authorization.discard(request_id)

    async def _post_streamable(self, frame: bytes, message: dict[str, Any], method: str | None,
                               is_request: bool) -> None:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        listen = method == _LISTEN
        timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=self._idle) if listen else None
        response = await self._send_authorized("POST", self.url, message, stream=True, content=frame, headers=headers,
                                               **({"timeout": timeout} if timeout is not None else {}))
        try:
            if self.kind == "auto" and response.status_code in (404, 405) and not is_json(response):
                # An HTTP+SSE server (2024-11-05) takes no POST here: the specification's fallback is its stream.
                await response.aclose()
                self.kind = "sse"
                log.info("server %s: %s refused a Streamable HTTP POST (%d); trying HTTP+SSE", self.name, self.url,
                         response.status_code)
                await self._open_sse()
                await self._post_to_endpoint(frame, message, is_request)
                return
            if self.kind == "auto" and response.status_code < 400:
                self.kind = "streamable-http"
            opened = asyncio.get_running_loop().time()
            streamed = await self._read_post_answer(response, message, is_request, listen)
        finally:
            await response.aclose()
        if listen and streamed and self.is_open:
            # The listen stream ended or went silent: the server's notifications ride it, so it is reopened, at
            # once after a long life and more slowly each time one ends as soon as it opened.
            lasted = asyncio.get_running_loop().time() - opened
            self._listen_delay = REOPEN_DELAY if lasted > _STABLE_STREAM else min(30.0, self._listen_delay * 2)
            await asyncio.sleep(self._listen_delay)
            if self.is_open:
                self._spawn(self._post(frame, message, method, is_request), message.get("id"))

    async def _read_post_answer(self, response: httpx2.Response, message: dict[str, Any], is_request: bool,
                                listen: bool) -> bool:
        """Deliver a POST's answer; True when it was an event stream (which a listen request reopens)."""
        status = response.status_code
        request_id = message.get("id")
        if status == 404 and self.session_id is not None:
            raise ConnectionDropped("the server ended the session (404 for its Mcp-Session-Id)")
        if status == 202 or not is_request:
            if is_request:
                self._answer_error(request_id, jsonrpc.INTERNAL_ERROR, "the server accepted the request (202) "
                                   "but sent no answer")
            return False
        if status >= 400:
            body = await read_limited(response, self._max_bytes)
            if body is not None and is_json(response) and self._deliver_error_body(body, request_id):
                return False
            hint = " (check the credentials in its headers)" if status in (401, 403) else ""
            self._answer_error(request_id, jsonrpc.UPSTREAM_UNAVAILABLE if status >= 500 else jsonrpc.INTERNAL_ERROR,
                               f"the server answered HTTP {status} {response.reason_phrase}".rstrip() + hint)
            return False
        if request_id == self._initialize_id and message.get("method") == "initialize":
            session = response.headers.get(SESSION_HEADER)
            if session:
                self.session_id = session
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if content_type == "application/json":
            body = await read_limited(response, self._max_bytes)
            if body is None:
                self._answer_error(request_id, jsonrpc.INTERNAL_ERROR,
                                   f"the server's answer is over the limit of {self._max_bytes} bytes")
                return False
            problem = not_a_message(body)
            if problem is not None:
                self._note(f"answered {message.get('method')} with JSON that is not a JSON-RPC message ({problem})")
                self._answer_error(request_id, jsonrpc.INTERNAL_ERROR,
                                   f"its answer is not a JSON-RPC message ({problem}): {shown(body)}")
                return False
            self._deliver(body, request_id)
        elif content_type == "text/event-stream":
            # On the session's wire a request's stream that closes early, having named an event id, is resumed.
            position = StreamPosition() if self._legacy and not listen else None
            if await self._read_events(response, request_id, ends_with_answer=not listen, position=position):
                assert position is not None
                await self._resume(request_id, position)
            return True
        else:
            self._answer_error(request_id, jsonrpc.INTERNAL_ERROR,
                               f"the server answered with {content_type or 'no content type'}, not JSON or SSE")
        return False

    def _deliver(self, body: bytes, request_id: Any = None) -> None:
        """Hand a frame up, noting what the transport itself needs from it (the legacy version negotiated, the
        tools whose arguments are mirrored in headers)."""
        if request_id in self._listing:
            self._listing.discard(request_id)
            self._learn_param_headers(body)
        if request_id is not None and request_id == self._initialize_id:
            try:
                answer = orjson.loads(body)
                version = answer.get("result", {}).get("protocolVersion")
                if isinstance(version, str):
                    self.protocol_version = version
            except (orjson.JSONDecodeError, AttributeError):
                pass
        self._on_frame(body)

    def _learn_param_headers(self, body: bytes) -> None:
        try:
            tools = orjson.loads(body)["result"]["tools"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        for tool in tools if isinstance(tools, list) else ():
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                annotated = annotated_params(tool.get("inputSchema"))
                if annotated:
                    self._param_headers[tool["name"]] = annotated
                else:
                    self._param_headers.pop(tool["name"], None)

    def _deliver_error_body(self, body: bytes, request_id: Any) -> bool:
        """A JSON-RPC error sent with an HTTP error status, given to the request it answers (its id may be null)."""
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(parsed, dict) or not isinstance(parsed.get("error"), dict):
            return False
        parsed["id"] = request_id
        self._on_frame(orjson.dumps(parsed))
        return True

    def _answer_error(self, request_id: Any, code: int, message: str) -> None:
        if request_id is not None:
            self._on_frame(orjson.dumps({"jsonrpc": "2.0", "id": request_id,
                                         "error": {"code": code, "message": f"server {self.name!r}: {message}"}}))
