"""Serving one client on Bastion's own stdio."""

from __future__ import annotations

import asyncio
import logging
import signal

from bastion.gateway.core import Gateway
from bastion.gateway.frontend import ClientConnection
from bastion.gateway.pipeline import Identity
from bastion.transport.stdio import CoalescingWriter, FrameTooLarge, open_stdio, read_frame

log = logging.getLogger("bastion")


async def serve_stdio(gateway: Gateway, protocol_fd: int, identity: Identity) -> None:
    channel = await open_stdio(protocol_fd, limit=gateway.config.max_message_bytes + 1)
    writer = channel.writer
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, done.set)

    frames = CoalescingWriter(writer)
    connection = ClientConnection(gateway, frames.write, identity=identity, close=done.set, drain=frames.drain)

    async def pump() -> None:
        while not done.is_set():
            try:
                frame = await read_frame(channel.reader, gateway.config.max_message_bytes)
            except FrameTooLarge as exc:
                log.warning("client: %s", exc)
                connection.frame_too_large(exc.size)
                continue
            if frame is None:
                return
            await connection.feed(frame)

    reader = asyncio.create_task(pump())
    stopper = asyncio.create_task(done.wait())
    await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
    reader.cancel()
    stopper.cancel()
    await connection.closed()
    try:
        await writer.drain()
        writer.close()
    except (ConnectionError, RuntimeError):
        pass
    await gateway.close()
