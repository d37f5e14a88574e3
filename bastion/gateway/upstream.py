"""One upstream MCP server: its process or connection, its credentials, its era, its outstanding requests, its
restarts."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Protocol

from bastion import __version__, progress
from bastion.config import ServerConfig
from bastion.transport.credentials import CredentialsError, UpstreamCredentials
from bastion.credentials.secrets import IdentitySecrets
from bastion.gateway.eager import Answer, RawAnswer
from bastion.gateway.restarts import (
    MAX_FAILED_STARTS,
    MEMORY_KILLED,
    STDERR_QUOTED,
    Backoff,
    quoted_stderr,
    retry_hint,
    wait_before_restart,
)
from bastion.gateway.twin import MirrorListener, Twin
from bastion.model import GatewayError
from bastion.protocol import jsonrpc
from bastion.protocol.client_session import (
    SELF,
    Answered,
    ClientSession,
    Dropped,
    Exchange,
    Failed,
    Garbage,
    ServerCancelled,
    ServerNotification,
    ServerRequest,
    Unattributed,
    Unmatched,
)
from bastion.protocol.correlation import Pending
from bastion.protocol.jsonrpc import ErrorResponse, Notification, RawResponse, Request, Response
from bastion.protocol.framing import Oversize
from bastion.transport.stdio import WriteBatch
from bastion.transport.upstream import (
    STDOUT_CLOSED,
    Launcher,
    ServerProcess,
    StartRefused,
    TransportClosed,
    UpstreamTransport,
    open_transport,
)

__all__ = ["Launcher", "ServerProcess", "StartRefused", "Upstream", "UpstreamListener"]

CLIENT_INFO = {"name": "bastion", "version": __version__}
# What a request refused for a server's full input is told: a server that reads again takes a backlog of a few
# MiB within a second, and one that does not stays refused whenever the caller comes back.
_RETRY_AFTER_FULL = 1


class UpstreamListener(Protocol):
    def upstream_ready(self, upstream: "Upstream") -> None: ...
    def upstream_down(self, upstream: "Upstream", reason: str) -> None: ...
    def upstream_notification(self, upstream: "Upstream", method: str, params: dict[str, Any], pending: Pending | None) -> None: ...
    async def upstream_request(self, upstream: "Upstream", method: str, params: dict[str, Any]) -> dict[str, Any]: ...


class Upstream:
    """One server: its client session (the protocol), its transport (the pipe or connection), and the supervision
    that starts it, restarts it when it ends, and fails what it leaves pending."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        listener: UpstreamListener,
        launch: Launcher,
        max_message_bytes: int,
        writes: WriteBatch,
        credentials: UpstreamCredentials | None = None,
        secrets: IdentitySecrets | None = None,
    ) -> None:
        """``credentials``: what a remote server's requests carry (asked anew for each); ``secrets``: a local
        server's per-identity variables, read when its process starts."""
        self.name = name
        self.config = config
        self.log = logging.getLogger(f"bastion.server.{name}")
        self._listener = listener
        self.credentials = credentials
        self.secrets = secrets
        self._launch = launch if secrets is None else _with_secrets(launch, secrets)
        self._max_bytes = max_message_bytes
        self._writes = writes
        self.session = ClientSession(name, era=config.era, client_info=CLIENT_INFO,
                                     max_message_bytes=max_message_bytes)
        self.ready = asyncio.Event()
        self.settled = asyncio.Event()  # set once the server is ready or has failed its first two starts
        self.launched = asyncio.Event()  # set once its first start has spawned a process, or failed to
        self.failure: str | None = None  # why the server is not ready, when it is not
        self.stopped = False  # it failed in a way no restart mends (see StartRefused); never started again
        # Its starts failed MAX_FAILED_STARTS times in a row: not started again until ``retry()``.
        self.gave_up = False
        self.failed_starts = 0  # the starts in a row that ended before the server was ready
        self.starts = 0  # every start since Bastion began (the first, and each restart)
        self.last_stderr: list[str] = []  # the last stderr lines of the latest start that failed
        # Since Bastion started, for the metrics: starts after the first, runs that ended after the server was ready
        # (a crash, an exit, a dropped connection), and those the sandbox's memory limit ended.
        self.restarts = 0
        self.crashes = 0
        self.memory_kills = 0
        self._retry = asyncio.Event()  # a person or a call asks for a start now
        self._outcome = asyncio.Event()  # set when a start ends, ready or failed; cleared when one is asked for
        self._told: tuple[str, tuple[str, ...]] | None = None  # the failure last said at WARNING, said once
        self._gave_up_told = False  # whether giving up on that failure was said
        # What its start is doing now, when a slow step says (bastion/progress.py): "installing PKG VERSION ...".
        self.doing: str | None = None
        # Whoever shows the servers' states (the status file of `bastion servers`) is told when this one's changes.
        self.on_status: Callable[[], None] = lambda: None
        self._ran = False  # whether this start got as far as ready
        self._spawned = False  # whether this start got as far as a process (which may have said why it failed)
        self._attempt: UpstreamTransport | None = None  # this start's transport, kept after its end for its stderr
        self._transport: UpstreamTransport | None = None  # the same while it runs, None once it is stopped
        self._relays: dict[Any, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        # Set when this start's stream can no longer be trusted (see _break): the start ends with its reason.
        self._broken: asyncio.Future[str] | None = None
        self._closing = False
        self._started_at = 0.0
        self._listen_wanted: dict[str, Any] = {}
        self._listen_resources: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop start() ran on; asked once, not per request
        # A server found to speak 2026-07-28 that may speak the handshake era too: its connection in that era, for
        # handshake-era clients (bastion/gateway/twin.py), made on their first request.
        self._twin = Twin(self)

    # ------------------------------------------------------------------------- what the session knows
    @property
    def client_capabilities(self) -> dict[str, Any]:
        """The client capabilities declared to a handshake-era server (and stamped by default on modern requests)."""
        return self.session.client_capabilities

    @client_capabilities.setter
    def client_capabilities(self, capabilities: Mapping[str, Any]) -> None:
        self.session.client_capabilities = dict(capabilities)

    @property
    def era(self) -> str | None:
        return self.session.era

    @property
    def protocol_version(self) -> str | None:
        facts = self.session.facts
        return facts.protocol_version if facts is not None else None

    @property
    def capabilities(self) -> dict[str, Any]:
        return self.session.capabilities

    @property
    def server_info(self) -> dict[str, Any] | None:
        facts = self.session.facts
        return facts.server_info if facts is not None else None

    @property
    def instructions(self) -> str | None:
        facts = self.session.facts
        return facts.instructions if facts is not None else None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (None while it is down, or for a server with no process)."""
        return getattr(self._transport, "pid", None)

    @property
    def _correlator(self) -> Any:
        return self.session.correlator

    # ----------------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._supervisor is None:
            self._loop = asyncio.get_running_loop()
            self._supervisor = asyncio.create_task(self._supervise(), name=f"upstream:{self.name}")

    async def close(self) -> None:
        self._closing = True
        await self._twin.close()
        if self._supervisor is not None:
            self._supervisor.cancel()
            try:
                await self._supervisor
            except (asyncio.CancelledError, Exception):
                pass
        await self._stop_transport()

    def busy(self) -> bool:
        """Whether a client's request is in flight on this server, or on its handshake-era connection (Bastion's own,
        the listen stream among them, are not a client's)."""
        twin = self._twin.upstream
        return any(origin != SELF for origin, _ in self._correlator.origins()) or (twin is not None and twin.busy())

    async def wait_started(self) -> None:
        """Wait until the server is ready or has failed to start within its own startup_timeout (for one-shot
        commands, which have no list_changed to take a late server in)."""
        await self.launched.wait()
        # The handshake is bounded by startup_timeout; a quick retry after a crash at start fits in the margin.
        try:
            await asyncio.wait_for(self.settled.wait(), self.config.startup_timeout + 2.0)
        except asyncio.TimeoutError:
            pass

    @property
    def status(self) -> str:
        """``ready``; ``starting`` (not ready yet, no start failed); ``failed`` (its latest start failed: restarted
        after a backoff, or not at all, see ``gave_up`` and ``stopped``); ``restarting`` (it was ready and ended)."""
        if self.ready.is_set():
            return "ready"
        if self.failed_starts or self.stopped:
            return "failed"
        return "restarting" if self.failure is not None else "starting"

    def retry(self) -> bool:
        """Start a server whose starts failed again now, without waiting out its backoff (once: failing again, it
        is not restarted until asked again); False when there is nothing to retry (it is ready or starting, or its
        configuration must change first)."""
        if self.stopped or self.ready.is_set() or not self.failed_starts or self._supervisor is None:
            return False
        self._outcome.clear()
        self._retry.set()
        return True

    async def retried(self) -> bool:
        """For a call to a server not restarted any more (``gave_up``): one start now, waited for within its
        ``startup_timeout``; whether the server is ready."""
        if not self.gave_up or not self.retry():
            return self.ready.is_set()
        self.log.info("server %s: a call asks for it: starting it again", self.name)
        try:
            await asyncio.wait_for(self._outcome.wait(), self.config.startup_timeout + 2.0)
        except asyncio.TimeoutError:
            pass
        return self.ready.is_set()

    def failed_message(self) -> str:
        """Why the server is not available and what retries it, for the error of a call to one of its tools."""
        if self.status != "failed":
            return (f"server {self.name!r} is not available: {self.doing or self.failure or 'starting'}; it joins "
                    f"when it is ready (clients are told with notifications/tools/list_changed)")
        if self.stopped:
            return f"server {self.name!r} is not available: {self.failure}; fix its configuration, then restart Bastion"
        stderr = quoted_stderr(self.last_stderr, remote=self.config.url is not None, spawned=True)
        times = f"{self.failed_starts} time{'s' if self.failed_starts > 1 else ''} in a row"
        return (f"server {self.name!r} is not available: it failed to start ({times}): {self.failure}{stderr}\n"
                f"{retry_hint(self.name)}")

    def _doing(self, step: str | None) -> None:
        self.doing = step
        self.on_status()

    async def _supervise(self) -> None:
        progress.watch(self._doing)  # this task's own: what a step of this server's start does is this server's
        backoff = Backoff(jitter=self.config.url is not None)
        first = True
        while not self._closing:
            if not first:
                self.restarts += 1
            first = False
            self._started_at = time.monotonic()
            self.starts += 1
            refused = False
            self.on_status()
            try:
                reason = await self._run_once()
            except StartRefused as exc:
                reason, refused = str(exc), True
            except Exception as exc:  # noqa: BLE001 - whatever went wrong, the server is restarted, never abandoned
                self.log.exception("server %s: internal error while running it", self.name)
                await self._stop_transport()
                reason = f"internal error in Bastion ({type(exc).__name__}: {exc})"
            self.launched.set()
            if self._closing:
                return
            ran = self._ran
            self.ready.clear()
            self.failure = reason
            self.failed_starts = 0 if ran else self.failed_starts + 1
            if ran:
                self._told = None  # a failure after a run that worked is news, even the same as before
            else:
                self.last_stderr = self.stderr_tail
            self._outcome.set()
            if backoff.failures >= 1 or refused:
                # Waiters give up on a server only after its quick first retry has failed too.
                self.settled.set()
            self._fail_pending(reason)
            self._listener.upstream_down(self, reason)
            if refused:
                self.stopped = True
                self.on_status()
                # an identity's instance is made anew on that identity's next call: no restart of Bastion needed
                after = "its next call tries again" if self.secrets is not None else \
                    "fix its configuration, then restart Bastion"
                self.log.warning("server %s: %s; not retried: %s%s", self.name, reason, after, self._quoted_stderr())
                return
            delay: float | None = backoff.next_delay(time.monotonic() - self._started_at)
            if self.failed_starts >= MAX_FAILED_STARTS and self.config.url is None:
                delay = None
                self.gave_up = True
            self._say_down(reason, delay)
            self.on_status()
            await wait_before_restart(delay, self.credentials, self._retry)
            if self.gave_up:
                # One start, asked for: failing again, it is not restarted until asked again.
                self.gave_up = False
                self.failed_starts = MAX_FAILED_STARTS - 1
                backoff.failures = 0

    def _say_down(self, reason: str, delay: float | None) -> None:
        """Say why the server is down and what happens next: at WARNING with its last stderr lines when the failure
        is news; a start that failed as the one before it did is only noted (at DEBUG), as is the retry."""
        told = (reason, tuple(self.stderr_tail[-STDERR_QUOTED:]))
        news = told != self._told
        self._told = told
        if news:
            self._gave_up_told = False
        if not self.failed_starts:  # it ran, then ended: restarted after the backoff
            self.log.warning("server %s: %s; restarting in %.1fs%s", self.name, reason, delay, self._quoted_stderr())
            return
        if delay is not None:
            if news:
                self.log.warning("server %s failed to start: %s; restarting in %.1fs%s", self.name, reason, delay,
                                 self._quoted_stderr())
            else:
                self.log.debug("server %s failed to start again, as before; restarting in %.1fs", self.name, delay)
            return
        if not news and self._gave_up_told:  # a retry that was asked for failed as before: its caller is told
            self.log.debug("server %s failed to start again, as before; not started again until asked", self.name)
            return
        self._gave_up_told = True
        self.log.warning("server %s failed: %d starts in a row failed (%s)%s; it is not started again until asked: "
                         "%s", self.name, self.failed_starts, reason,
                         self._quoted_stderr() + "\n" if news else "", retry_hint(self.name))

    @property
    def stderr_tail(self) -> list[str]:
        """The server's last stderr lines of its latest start."""
        return self._attempt.diagnostics() if self._attempt is not None else []

    def _quoted_stderr(self) -> str:
        """The server's last stderr lines of this start, for the message that says why it failed."""
        return quoted_stderr(self.stderr_tail, remote=self.config.url is not None, spawned=self._spawned)

    async def _run_once(self) -> str:
        self._spawned = False
        self._ran = False  # whether this start got as far as ready
        broken = self._broken = asyncio.get_running_loop().create_future()
        transport = self._attempt = open_transport(self.name, self.config, launch=self._launch,
                                                   max_message_bytes=self._max_bytes, writes=self._writes,
                                                   credentials=self.credentials)
        try:
            await transport.start(self)
        except StartRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - any start failure is reported, never raised into the gateway
            await transport.close()
            return f"failed to start: {exc}"
        self.launched.set()
        self._spawned = True
        self._transport = transport
        ended = asyncio.create_task(self._ends(transport, broken))
        sweeper = asyncio.create_task(self._sweep_deadlines())
        try:
            reason = await self._handshake_or_exit(ended)
            if reason is None:
                self.failure = None
                self._ran = True
                self.failed_starts = 0
                self.ready.set()
                self.settled.set()
                self._outcome.set()
                transport_live = getattr(transport, "live", None)
                if transport_live is not None:
                    transport_live()  # from now on its stderr lines are logged as they come
                self.on_status()
                self.log.info("server %s ready (%s era, protocol %s)", self.name, self.era, self.protocol_version)
                self._listener.upstream_ready(self)
                reason = await ended
            if not self._closing:
                # Counted before what it had in flight fails: whoever that error reaches finds the crash counted.
                self.crashes += self._ran
                self.memory_kills += MEMORY_KILLED in reason
            self._down(reason)  # now: stopping what is left of the process may take its grace periods
        finally:
            await self._stop_transport()
            ended.cancel()
            sweeper.cancel()
            await asyncio.gather(ended, sweeper, return_exceptions=True)
        if not self.ready.is_set():
            refusal = transport.refusal()
            if refusal is not None:
                raise StartRefused(refusal)
        return reason

    @staticmethod
    async def _ends(transport: UpstreamTransport, broken: asyncio.Future[str]) -> str:
        """Why this start ends: the transport's end (the process exited or closed its stdout, the connection
        dropped), or a stream Bastion can no longer trust (``broken``), whichever comes first."""
        ended = asyncio.ensure_future(transport.ended())
        try:
            await asyncio.wait({ended, broken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not ended.done():
                ended.cancel()
        return broken.result() if broken.done() else ended.result()

    def _down(self, reason: str) -> None:
        """This start has ended, or is about to: no request goes to it any more, and those it has fail now."""
        self.ready.clear()
        self.failure = reason
        self._fail_pending(reason)

    def _break(self, reason: str) -> None:
        """The server's stream can no longer be trusted: fail what it has in flight now, and end this start (the
        supervisor stops the process and starts it again)."""
        broken = self._broken
        if broken is None or broken.done():
            return
        broken.set_result(reason)
        self._down(reason)

    async def _handshake_or_exit(self, ended: asyncio.Task[str]) -> str | None:
        """Why the handshake failed, or None; a server that exits mid-handshake is noticed at once."""
        handshake = asyncio.create_task(self._handshake())
        try:
            done, _ = await asyncio.wait({handshake, ended}, timeout=self.config.startup_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # Bastion is closing: the handshake goes with it
            handshake.cancel()
            raise
        if handshake not in done:
            handshake.cancel()
            await asyncio.gather(handshake, return_exceptions=True)
            if ended in done:
                why = ended.result()
                if self.config.url is not None:
                    return f"lost the connection during the handshake ({why})"
                if why == STDOUT_CLOSED or (self._broken is not None and self._broken.done()):
                    return f"{why} during the handshake"
                return f"exited during the handshake ({why})"
            return f"no answer to the handshake within {self.config.startup_timeout:g}s"
        try:
            handshake.result()
        except GatewayError as exc:
            return f"handshake failed: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - an answer Bastion cannot use fails this start, not supervision
            self.log.debug("server %s: handshake answer not usable", self.name, exc_info=True)
            return f"handshake failed: Bastion could not use the server's answer ({type(exc).__name__}: {exc})"
        return None

    async def _stop_transport(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.close()

    async def _handshake(self) -> None:
        """Carry out the session's handshake decisions; a step that fails raises GatewayError."""
        handshake = self.session.handshake()
        step = handshake.first()
        while isinstance(step, Exchange):
            try:
                answer = await asyncio.wait_for(self._exchange(step.method, step.params), step.timeout)
            except asyncio.TimeoutError:
                step = handshake.timed_out()
            else:
                step = handshake.answered(answer)
        if isinstance(step, Failed):
            raise GatewayError(jsonrpc.INTERNAL_ERROR, step.reason)
        if step.notify is not None:
            self._send(step.notify)
        self.session.adopt(step.facts)
        if step.facts.era == "modern":
            self._open_listen()

    def _open_listen(self) -> None:
        """Modern servers deliver list_changed and resource updates on a long-lived subscriptions/listen."""
        capabilities = self.capabilities
        self._listen_wanted = {
            "toolsListChanged": bool((capabilities.get("tools") or {}).get("listChanged")),
            "promptsListChanged": bool((capabilities.get("prompts") or {}).get("listChanged")),
            "resourcesListChanged": bool((capabilities.get("resources") or {}).get("listChanged")),
        }
        self._reopen_listen()

    def _reopen_listen(self) -> None:
        frames, _ = self.session.listen_request(self._listen_wanted, self._listen_resources)
        for frame in frames:
            self._write(frame)

    async def set_resource_subscriptions(self, uris: list[str]) -> None:
        """Modern servers: the set of resource URIs the listen stream covers (legacy uses resources/subscribe)."""
        self._listen_resources = list(uris)
        self._reopen_listen()

    # --------------------------------------------------------------------------------------- requests
    async def request(
        self,
        method: str,
        params: dict[str, Any] | None,
        *,
        origin: Any = SELF,
        origin_id: Any = None,
        progress_token: Any = None,
        log_level: str | None = None,
        timeout: float | None = None,
        client_capabilities: Mapping[str, Any] | None = None,
        encode: Callable[[Any, str, Any], bytes] = jsonrpc.request_frame,
        keep_raw: bool = False,
        client_era: str | None = None,
    ) -> Any:
        """Send a request and return its result; a JSON-RPC error, a crash or a timeout raise GatewayError.

        ``client_capabilities`` are the requesting client's, stamped on requests to a modern server (a legacy
        server learned the client's capabilities at the handshake). ``encode`` frames the request
        (``raw_request_frame`` for params holding raw JSON). ``keep_raw`` returns a success as the
        ``RawResponse`` it arrived in, undecoded, for a caller that only passes it on. ``client_era`` is the
        requesting client's: a handshake-era client's request to a server that speaks both eras goes to the
        server in the handshake era (bastion/gateway/twin.py).
        """
        if client_era == "legacy" and self.session.era == "modern" and self._twin.wanted():
            twin = await self._twin.ready()
            if twin is not None:
                return await twin.request(method, params, origin=origin, origin_id=origin_id,
                                          progress_token=progress_token, log_level=log_level, timeout=timeout,
                                          encode=encode, keep_raw=keep_raw)
        if not self.ready.is_set() and not (self.gave_up and await self.retried()):
            raise GatewayError(jsonrpc.UPSTREAM_UNAVAILABLE, self.failed_message())
        outgoing = self._outgoing_params(params, progress_token, log_level, client_capabilities)
        pending = self._begin(method, outgoing, origin, origin_id, progress_token, timeout or self.config.request_timeout,
                              RawAnswer(loop=self._loop) if keep_raw else None, encode)
        answer = await self._answer(pending)
        if type(answer) is ErrorResponse:
            raise GatewayError.from_error(answer.error)
        if type(answer) is RawResponse:
            return answer
        return answer.result

    # ------------------------------------------------------------------------------------- era mirroring
    def handshake_era_copy(self) -> Upstream:
        """This server again, in the handshake era: the twin's connection (bastion/gateway/twin.py), which tells the
        gateway what a twin tells (``MirrorListener``)."""
        return Upstream(self.name, self.config.model_copy(update={"era": "legacy"}), MirrorListener(self._listener),
                        self._launch, self._max_bytes, self._writes, credentials=self.credentials)

    def _outgoing_params(self, params: dict[str, Any] | None, progress_token: Any, log_level: str | None,
                         client_capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self.session.outgoing_params(params, progress_token, log_level, client_capabilities)

    async def _exchange(self, method: str, params: dict[str, Any] | None) -> Response | ErrorResponse:
        """A request Bastion makes on its own behalf (the handshake and its probe)."""
        return await self._answer(self._begin(method, params, SELF, None, None, None))

    def _begin(self, method: str, params: dict[str, Any] | None, origin: Any, origin_id: Any, progress_token: Any,
               timeout: float | None, context: Any = None,
               encode: Callable[[Any, str, Any], bytes] = jsonrpc.request_frame) -> Pending:
        """Register a request and send it; its answer arrives in ``pending.context``: an ``Answer``, or the
        ``context`` given (anything with ``settle(answer)``)."""
        transport = self._transport
        if transport is not None and transport.backlog() > self.config.max_queued_bytes:
            self._refuse_full(method, transport.backlog())
        loop = self._loop
        future = Answer(loop=loop) if context is None else context
        deadline = loop.time() + timeout if timeout is not None else None
        pending, frame = self.session.begin(method, params, origin=origin, origin_id=origin_id, deadline=deadline,
                                            progress_token=progress_token, context=future, encode=encode)
        try:
            self._write(frame)
        except GatewayError:
            self.session.forget(pending)
            raise
        return pending

    def _refuse_full(self, method: str, queued: int) -> None:
        """A server that stopped reading its stdin gets no more requests once ``max_queued_bytes`` wait for it:
        the caller is told to retry, rather than Bastion's memory growing with what the server never reads."""
        raise GatewayError(jsonrpc.SERVER_BUSY, (
            f"server {self.name!r} is not reading its input: {queued} bytes wait for it, over max_queued_bytes "
            f"({self.config.max_queued_bytes}); {method} refused, retry in {_RETRY_AFTER_FULL} s"),
            {"retryAfterSeconds": _RETRY_AFTER_FULL})

    async def _answer(self, pending: Pending) -> Response | ErrorResponse:
        try:
            return await pending.context
        except asyncio.CancelledError:
            self._abandon(pending, "cancelled by the client")
            raise

    async def _sweep_deadlines(self) -> None:
        """Time requests out in one place rather than arming a timer for each request on the hot path."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.25)
            for pending in self.session.expired(loop.time()):
                self._tell_cancelled(pending, "timed out")
                _settle(pending, ErrorResponse(pending.upstream_id, jsonrpc.error(
                    jsonrpc.REQUEST_TIMEOUT, f"server {self.name!r} did not answer {pending.method} in time")))

    def _abandon(self, pending: Pending, reason: str) -> None:
        self._tell(self.session.abandon(pending, reason))

    def _tell_cancelled(self, pending: Pending, reason: str) -> None:
        """A request the session has already given up on (its deadline passed): tell the server."""
        self._tell(self.session.abandon(pending, reason))

    def _tell(self, frame: bytes) -> None:
        if self._transport is not None:
            try:
                self._write(frame)
            except GatewayError:  # the server is gone: there is nobody left to tell
                pass

    def notify(self, method: str, params: dict[str, Any] | None) -> None:
        if self.ready.is_set():
            self._send(Notification(method, params))

    def _send(self, message: jsonrpc.Message) -> None:
        self._write(jsonrpc.encode(message))

    def _write(self, frame: bytes) -> None:
        transport = self._transport
        if transport is None:
            raise GatewayError(jsonrpc.UPSTREAM_UNAVAILABLE, f"server {self.name!r} is not running")
        try:
            transport.send(frame)
        except TransportClosed as exc:
            raise GatewayError(jsonrpc.UPSTREAM_UNAVAILABLE, f"server {self.name!r} is not reachable: {exc}") from None

    def _fail_pending(self, reason: str) -> None:
        for pending in self.session.drain():
            _settle(pending, ErrorResponse(pending.upstream_id, jsonrpc.error(
                jsonrpc.UPSTREAM_UNAVAILABLE, f"server {self.name!r} {reason} while handling {pending.method}")))
        for task in self._relays.values():
            task.cancel()
        self._relays.clear()

    # ------------------------------------------------------------------------------------------- reading
    def frames_received(self, frames: Iterable[bytes | Oversize]) -> None:
        """The transport's receiver: one chunk of the server's frames, handled in one write batch."""
        self._writes.deliver(frames, self._on_frame)

    def _on_frame(self, frame: bytes | Oversize) -> None:
        broken = self._broken
        if broken is not None and broken.done():
            return  # what a server sends after its stream was found broken answers nothing still waiting
        if type(frame) is Oversize:
            self._on_oversize(frame)  # type: ignore[arg-type]
            return
        event = self.session.receive(frame)  # type: ignore[arg-type]
        kind = type(event)
        if kind is Answered:
            pending, message = event.pending, event.message  # type: ignore[union-attr]
            # A result stays bytes only for a caller that passes it on (a RawAnswer); anyone else reads it.
            if type(message) is RawResponse and not getattr(pending.context, "keeps_raw", False):
                message = message.decoded()
            _settle(pending, message)
        elif kind is ServerNotification:
            self._listener.upstream_notification(self, event.method, event.params, event.pending)  # type: ignore[union-attr]
        elif kind is ServerRequest:
            self._on_request(event.request)  # type: ignore[union-attr]
        elif kind is ServerCancelled:
            task = self._relays.pop(event.request_id, None)  # type: ignore[union-attr]
            if task is not None:
                task.cancel()
        elif kind is Unmatched:
            if not event.expected:  # type: ignore[union-attr]
                self.log.warning("server %s answered unknown request id %r; ignored", self.name, event.id)  # type: ignore[union-attr]
        elif kind is Garbage:
            shown = event.frame[:200].decode("utf-8", "replace")  # type: ignore[union-attr]
            self.log.warning("server %s wrote non-protocol output on stdout (%s), ignored: %r", self.name,
                             event.reason, shown)  # type: ignore[union-attr]

    def _on_oversize(self, frame: Oversize) -> None:
        """A message over ``max_message_bytes``, dropped unread: the call it answers fails now, saying so; one whose
        call cannot be told fails every call in flight, and the server is restarted (docs/protocol.md)."""
        event = self.session.oversize(frame)
        kind = type(event)
        if kind is Answered:
            pending = event.pending  # type: ignore[union-attr]
            self.log.error("server %s answered %s with a message of %d bytes, over max_message_bytes (%d); the call "
                           "fails", self.name, pending.method, frame.size, frame.limit)
            _settle(pending, event.message)  # type: ignore[union-attr]
        elif kind is Dropped:
            self.log.error("server %s sent a %s of %d bytes, over max_message_bytes (%d); dropped", self.name,
                           event.what, frame.size, frame.limit)  # type: ignore[union-attr]
            if event.reply is not None:  # type: ignore[union-attr]
                self._tell(event.reply)  # type: ignore[union-attr]
        elif kind is Unmatched:
            self.log.error("server %s answered request %r, no longer awaited, with a message of %d bytes, over "
                           "max_message_bytes (%d); dropped", self.name, event.id, frame.size, frame.limit)  # type: ignore[union-attr]
        elif kind is Unattributed:
            self.log.error("server %s %s; failing its calls in flight", self.name, event.reason)  # type: ignore[union-attr]
            self._break(event.reason)  # type: ignore[union-attr]

    def _on_request(self, message: Request) -> None:
        # An eager Task (Python 3.12+) may have answered by the time it is made (a ping whose route waits on
        # nothing): it is not kept then, as its own ``finally`` has already run.
        task = asyncio.create_task(self._relay(message))
        if not task.done():
            self._relays[message.id] = task

    async def _relay(self, message: Request) -> None:
        try:
            result = await self._listener.upstream_request(self, message.method, message.params or {})
            reply: jsonrpc.Message = Response(message.id, result)
        except GatewayError as exc:
            reply = ErrorResponse(message.id, exc.to_error())
        except asyncio.CancelledError:
            return
        finally:
            self._relays.pop(message.id, None)
        if self._transport is not None:
            self._send(reply)


def _with_secrets(launch: Launcher, secrets: IdentitySecrets) -> Launcher:
    """``launch`` with the identity's own variables added to the server's env; a secret not set refuses the start
    (no retry would find it) with the command that sets it."""
    async def launch_with_secrets(name: str, config: ServerConfig) -> ServerProcess:
        try:
            own = await secrets.environment()
        except CredentialsError as exc:
            raise StartRefused(str(exc)) from None
        return await launch(name, config.model_copy(update={"env": {**config.env, **own}}))
    return launch_with_secrets


def _settle(pending: Pending, answer: Response | ErrorResponse) -> None:
    if pending.context is not None:  # the modern listen stream has nobody waiting on it
        pending.context.settle(answer)
