"""The loopback listener that authorization redirects come back to is bounded like the gateway's own: a local
process that opens connections and sends nothing cannot hold more than a few of the gateway's descriptors, and a
browser's redirect is still answered once they are gone. A real listener on 127.0.0.1, real sockets."""

from __future__ import annotations

import asyncio

from bastion.credentials.callback import CALLBACK_CONNECTIONS, CALLBACK_PATH, Callbacks, LoopbackListener


async def _answer(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return answer


async def test_stalled_connections_are_bounded_and_a_redirect_is_answered_after_them() -> None:
    listener = LoopbackListener(Callbacks())
    port = int((await listener.redirect_uri()).rsplit(":", 1)[1].split("/")[0])
    stalled = []
    try:
        for _ in range(CALLBACK_CONNECTIONS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET " + CALLBACK_PATH.encode())  # a request line never finished
            await writer.drain()
            stalled.append((reader, writer))
        one_more = await _answer(port, b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        assert one_more.startswith(b"HTTP/1.1 503"), one_more
        for _, writer in stalled:
            writer.close()
        stalled.clear()
        redirect = f"GET {CALLBACK_PATH}?state=unknown&code=x HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
        while (answer := await _answer(port, redirect.encode())).startswith(b"HTTP/1.1 503"):
            pass  # the listener sees the stalled connections close a moment after they do
        assert answer.startswith(b"HTTP/1.1 400"), answer
    finally:
        for _, writer in stalled:
            writer.close()
        await listener.close()
