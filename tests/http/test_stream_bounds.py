"""A bounded SSE stream under uvicorn on a real loopback socket: a reader that never reads makes the writer wait
on the socket, the stream's buffer fills to its bound, and the stream closes instead of growing."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from bastion.transport.http.server import QuietServer, listen
from bastion.transport.http.streams import SseStream, sse_event, wait_disconnect

EVENT = sse_event(b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + b"x" * 60000 + b'"}}')


async def test_a_reader_that_never_reads_gets_its_stream_closed_at_the_bound() -> None:
    streams: list[SseStream] = []
    finished = asyncio.Event()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        stream = SseStream(send, limit=8, heartbeat=0.5)
        streams.append(stream)
        writer = asyncio.ensure_future(stream.run())
        gone = asyncio.ensure_future(wait_disconnect(receive))

        async def produce() -> None:
            while stream.push(EVENT):
                await asyncio.sleep(0)  # a fast producer: the gateway's send never waits

        producer = asyncio.ensure_future(produce())
        await asyncio.wait((writer, gone), return_when=asyncio.FIRST_COMPLETED)
        for task in (writer, gone, producer):
            task.cancel()
        finished.set()

    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = QuietServer(uvicorn.Config(app, loop="none", lifespan="off", log_config=None, access_log=False))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(reader, ("127.0.0.1", port))
        await asyncio.get_running_loop().sock_sendall(reader, b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await asyncio.wait_for(finished.wait(), 120)  # never read a byte
        assert streams[0].overflowed
        assert streams[0].ended.is_set()
    finally:
        reader.close()
        server.should_exit = True
        await asyncio.wait_for(serving, 60)
