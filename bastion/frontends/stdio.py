"""Serving one client on Bastion's own stdio."""

from __future__ import annotations

import asyncio
import logging
import signal

from bastion.gateway.core import Gateway
from bastion.frontends.connection import ClientConnection
from bastion.model import Identity
from bastion.protocol.framing import Oversize
from bastion.transport.stdio import CoalescingWriter, open_protocol_writer, read_stdin

log = logging.getLogger("bastion")


async def serve_stdio(gateway: Gateway, protocol_fd: int, identity: Identity) -> signal.Signals | None:
    """Serve until the client leaves or SIGTERM or SIGINT says stop; the signal, if one did (after a clean shutdown).
    SIGHUP is not a stop: it reloads the configuration (``bastion.cli.gateway.with_reloading``)."""
    # Servers start now, all at once, not at the client's first message: the client's start then waits only for
    # what is still starting, and at most ready_timeout.
    gateway.start()
    done = asyncio.Event()
    writer = await open_protocol_writer(protocol_fd)
    frames = CoalescingWriter(writer, gateway.writes)
    connection = ClientConnection(gateway, frames.write, identity=identity, close=done.set, drain=frames.drain)
    if gateway.metrics is not None:
        gateway.metrics.sessions["stdio"] = lambda: 0 if done.is_set() else 1

    def on_frame(frame: bytes | Oversize) -> None:
        if done.is_set():
            return
        if isinstance(frame, Oversize):
            log.warning("client sent a frame of %d bytes, over the limit of %d; discarded", frame.size, frame.limit)
            connection.frame_too_large(frame.size)
        else:
            connection.feed(frame)

    await read_stdin(on_frame, done.set, gateway.config.max_message_bytes, gateway.writes)
    loop = asyncio.get_running_loop()
    stopped_by: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    await done.wait()
    await connection.closed()
    try:
        await writer.drain()
        writer.close()
    except (ConnectionError, RuntimeError):
        pass
    await gateway.close()
    return stopped_by[0] if stopped_by else None
