"""A bounded SSE stream under uvicorn on a real loopback socket: a reader that never reads makes the writer wait
on the socket, the stream's buffer fills to its bound, and the stream closes instead of growing; a reader that
catches up afterwards finds, as the stream's last event, the notice that says why it ended."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from bastion.transport.listener import QuietServer, listen
from bastion.frontends.http.streams import SseStream, sse_event, wait_disconnect

EVENT = sse_event(b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + b"x" * 60000 + b'"}}')
NOTICE = sse_event(b'{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"closed: 8 messages waited unread"}}')


async def serve_one_flooded_stream(streams: list[SseStream], finished: asyncio.Event, **options):
    """An ASGI app whose every GET is an SSE stream a fast producer floods."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        stream = SseStream(send, limit=8, heartbeat=0.5, **options)
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
    server = QuietServer(uvicorn.Config(app, loop="none", lifespan="off", log_config=None, access_log=False))
    return server, sock.getsockname()[1], asyncio.ensure_future(server.serve(sockets=[sock]))


async def test_a_reader_that_never_reads_gets_its_stream_closed_at_the_bound() -> None:
    streams: list[SseStream] = []
    finished = asyncio.Event()
    server, port, serving = await serve_one_flooded_stream(streams, finished, notice=NOTICE, notice_grace=0.5)
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


async def test_a_reader_that_catches_up_after_the_overflow_reads_the_notice_last() -> None:
    streams: list[SseStream] = []
    finished = asyncio.Event()
    server, port, serving = await serve_one_flooded_stream(streams, finished, notice=NOTICE, notice_grace=300)
    loop = asyncio.get_running_loop()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.setblocking(False)
    try:
        await loop.sock_connect(reader, ("127.0.0.1", port))
        await loop.sock_sendall(reader, b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        deadline = loop.time() + 120
        while not streams or not streams[0].overflowed:  # not a byte read until the bound is passed
            assert loop.time() < deadline, "the stream never reached its bound"
            await asyncio.sleep(0.05)
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end: the response was completed
            chunk = await asyncio.wait_for(loop.sock_recv(reader, 65536), 120)
            assert chunk, "the connection closed before the notice"
            received += chunk
        await asyncio.wait_for(finished.wait(), 120)
        events = [part.rstrip(b"\n") for part in bytes(received).split(b"\r\n") if part.startswith(b"data: ")]
        assert events[-1] == NOTICE.rstrip(b"\n")  # the last event is the notice, after some of the flood
        # What the socket's buffers took before the writer had to wait; nothing after the notice, nothing garbled.
        assert len(events) >= 2 and all(event == EVENT.rstrip(b"\n") for event in events[:-1])
        assert streams[0].overflowed and not streams[0].completed
    finally:
        reader.close()
        server.should_exit = True
        await asyncio.wait_for(serving, 60)


async def test_what_a_finished_stream_withdraws_is_gone_before_its_client_sees_the_end() -> None:
    """A call's answer stream forgets the call (nothing more to resume) once its last event is written and before
    the response ends: a client that reads the end of the response and resumes at once must find it forgotten."""
    loop = asyncio.get_running_loop()
    seen_at_completion: list[bool] = []
    ended_on_the_wire = asyncio.Event()
    answer = sse_event(b'{"jsonrpc":"2.0","id":11,"result":{}}')

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return

        async def watched_send(message):
            await send(message)
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                ended_on_the_wire.set()

        stream = SseStream(watched_send, limit=8, heartbeat=30)
        stream.on_complete = lambda: seen_at_completion.append(ended_on_the_wire.is_set())
        stream.push(answer)
        stream.finish()
        await stream.run()

    sock = listen("127.0.0.1", 0)
    server = QuietServer(uvicorn.Config(app, loop="none", lifespan="off", log_config=None, access_log=False))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    reader = socket.socket()
    reader.setblocking(False)
    try:
        await loop.sock_connect(reader, ("127.0.0.1", sock.getsockname()[1]))
        await loop.sock_sendall(reader, b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end: the response was completed
            chunk = await asyncio.wait_for(loop.sock_recv(reader, 65536), 60)
            assert chunk, "the connection closed before the response ended"
            received += chunk
        assert answer in bytes(received)
        assert seen_at_completion == [False]  # called once, before the response's end was sent
    finally:
        reader.close()
        server.should_exit = True
        await asyncio.wait_for(serving, 60)
