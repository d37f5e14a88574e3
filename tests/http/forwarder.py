"""A load balancer of the simplest kind, for tests of replicas: a loopback TCP port whose new connections go to the
replica it points at now; ``point_at`` another one closes the connections open (as a balancer draining a replica
does, unless told not to), so that a client's next request lands on the new one."""

from __future__ import annotations

import asyncio

from bastion.transport.listener import listen


class Forwarder:
    def __init__(self, target: str) -> None:
        self.target = target  # "http://127.0.0.1:PORT"
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.url = ""

    async def start(self) -> "Forwarder":
        self._server = await asyncio.start_server(self._pipe, sock=listen("127.0.0.1", 0))
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def point_at(self, target: str, *, drain: bool = True) -> None:
        """New connections go to ``target``; ``drain``: the open ones are closed (else they stay where they are)."""
        self.target = target
        if drain:
            for writer in list(self._open):
                writer.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        self.point_at(self.target)
        await self._server.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.target.removeprefix("http://").rsplit(":", 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            self._open.difference_update((writer, up_writer))
            for end in (writer, up_writer):
                end.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
