"""A tiny TCP forwarder, a process of its own: ``forwarder.py LISTEN_PORT TARGET_PORT`` on loopback. It prints
``forwarding`` once it listens; killing it cuts every connection through it, which is how a test takes one replica's
Redis away while the others keep theirs."""

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(listen: int, target: int) -> None:
    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(connected, "127.0.0.1", listen)
    print("forwarding", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
