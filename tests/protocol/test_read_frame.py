"""Newline-delimited framing over a byte stream: split reads, CRLF, the size limit, recovery after bad frames."""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.protocol.jsonrpc import (
    INVALID_REQUEST,
    PARSE_ERROR,
    InvalidFrame,
    Notification,
    Request,
    encode,
    parse_frame,
)
from bastion.transport.stdio import FrameTooLarge, read_frame

from tests.properties import PROPERTY

MAX = 64  # frame limit used throughout; the reader's own buffer limit is set per test


def reader_with(data: bytes, *, limit: int = 4 * MAX, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def read_all(reader: asyncio.StreamReader, max_bytes: int = MAX) -> list[bytes | FrameTooLarge]:
    """Every frame until end of stream; an oversized frame shows up as its FrameTooLarge."""
    out: list[bytes | FrameTooLarge] = []
    while True:
        try:
            frame = await read_frame(reader, max_bytes)
        except FrameTooLarge as exc:
            out.append(exc)
            continue
        if frame is None:
            return out
        out.append(frame)


async def test_frames_are_split_on_newlines() -> None:
    assert await read_all(reader_with(b"a\nbb\nccc\n")) == [b"a", b"bb", b"ccc"]


async def test_crlf_line_endings_are_stripped() -> None:
    assert await read_all(reader_with(b"a\r\nb\nc\r\n")) == [b"a", b"b", b"c"]


async def test_last_frame_may_lack_its_newline() -> None:
    assert await read_all(reader_with(b"a\nlast")) == [b"a", b"last"]


async def test_empty_lines_are_empty_frames() -> None:
    assert await read_all(reader_with(b"\n\na\n")) == [b"", b"", b"a"]


async def test_end_of_stream_is_none_and_stays_none() -> None:
    reader = reader_with(b"")
    assert await read_frame(reader, MAX) is None
    assert await read_frame(reader, MAX) is None


async def test_a_frame_waits_for_its_newline() -> None:
    reader = asyncio.StreamReader(limit=4 * MAX)
    pending = asyncio.ensure_future(read_frame(reader, MAX))
    reader.feed_data(b'{"jsonrpc":')
    await asyncio.sleep(0)
    assert not pending.done()
    reader.feed_data(b'"2.0","method":"x"}\nnext')
    assert await asyncio.wait_for(pending, 5) == b'{"jsonrpc":"2.0","method":"x"}'


async def test_frame_of_exactly_the_limit_is_read() -> None:
    assert await read_all(reader_with(b"x" * MAX + b"\n")) == [b"x" * MAX]


async def test_crlf_frame_of_exactly_the_limit_is_accepted_because_the_line_ending_does_not_count() -> None:
    # The limit applies to the message itself; "\r\n" and "\n" endings are both framing.
    frames = await read_all(reader_with(b"x" * MAX + b"\r\nok\n"))
    assert frames == [b"x" * MAX, b"ok"]


@pytest.mark.parametrize("reader_limit", [4 * MAX, MAX + 2, MAX // 2], ids=["within reader buffer", "at reader buffer", "beyond reader buffer"])
@pytest.mark.parametrize("size", [MAX + 1, MAX + 2, 3 * MAX, 50 * MAX])
async def test_oversized_frame_is_discarded_and_the_stream_goes_on(reader_limit: int, size: int) -> None:
    reader = reader_with(b"first\n" + b"y" * size + b"\nsecond\n", limit=reader_limit)
    frames = await read_all(reader)
    assert frames[0] == b"first" and frames[2:] == [b"second"]
    too_large = frames[1]
    assert isinstance(too_large, FrameTooLarge)
    assert too_large.limit == MAX
    assert MAX < too_large.size <= size
    assert f"exceeds the limit of {MAX} bytes" in str(too_large)


async def test_oversized_frame_arriving_in_small_chunks_is_discarded() -> None:
    reader = asyncio.StreamReader(limit=MAX)
    consumer = asyncio.ensure_future(read_all(reader))
    for chunk in [b"a\n"] + [b"z" * 7] * 100 + [b"\nb\n"]:
        reader.feed_data(chunk)
        await asyncio.sleep(0)
    reader.feed_eof()
    frames = await asyncio.wait_for(consumer, 5)
    assert frames[0] == b"a" and frames[2:] == [b"b"]
    assert isinstance(frames[1], FrameTooLarge)


@pytest.mark.parametrize("reader_limit", [4 * MAX, MAX // 2])
async def test_oversized_last_frame_without_newline(reader_limit: int) -> None:
    frames = await read_all(reader_with(b"a\n" + b"y" * (10 * MAX), limit=reader_limit))
    assert frames[0] == b"a" and len(frames) == 2 and isinstance(frames[1], FrameTooLarge)


async def test_last_frame_one_byte_over_the_limit_is_refused() -> None:
    with pytest.raises(FrameTooLarge):
        await read_frame(reader_with(b"y" * (MAX + 1)), MAX)


async def test_bad_frames_cost_nothing_but_themselves() -> None:
    """Everything a client can get wrong, interleaved with good requests: each bad frame gets its answer and
    every good request still arrives, in order."""
    good = [Request(1, "ping", None), Notification("notifications/initialized", None), Request("z", "tools/list", None)]
    stream = b"".join([
        encode(good[0]),
        b'{"jsonrpc":"2.0","method":"\xff"}\n',
        b"{not json\n",
        b'{"jsonrpc":"2.0","id":2,"method":"' + b"w" * 400 + b'"}\n',
        b'[{"jsonrpc":"2.0","id":3,"method":"ping"}]\n',
        encode(good[1]),
        b'{"jsonrpc":"2.0","id":null,"method":"ping"}\n',
        b"\n",
        encode(good[2]),
    ])
    answers: list[int] = []
    messages = []
    for frame in await read_all(reader_with(stream, limit=1024), max_bytes=256):
        if isinstance(frame, FrameTooLarge):
            answers.append(INVALID_REQUEST)
            continue
        parsed = parse_frame(frame, 256)
        if isinstance(parsed, InvalidFrame):
            assert parsed.reply is not None
            answers.append(parsed.reply.error["code"])
        else:
            messages.append(parsed)
    assert messages == good
    assert answers == [PARSE_ERROR, PARSE_ERROR, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST, PARSE_ERROR]


async def test_frames_over_a_real_pipe() -> None:
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    reader = asyncio.StreamReader(limit=1 << 20)
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), source)
        try:
            messages = [Request(i, "tools/call", {"name": "echo", "arguments": {"text": "x" * (i * 997)}}) for i in range(1, 40)]
            payload = b"".join(encode(m) for m in messages) + b"y" * 200_000 + b"\n" + encode(messages[0])

            def write_in_odd_pieces() -> None:
                with os.fdopen(write_fd, "wb", buffering=0) as sink:
                    for start in range(0, len(payload), 4093):
                        sink.write(payload[start:start + 4093])

            writer = asyncio.ensure_future(asyncio.to_thread(write_in_odd_pieces))
            frames = await asyncio.wait_for(read_all(reader, max_bytes=100_000), 30)
            await writer
        finally:
            transport.close()
    assert [parse_frame(f) for f in frames[:-2]] == messages
    assert isinstance(frames[-2], FrameTooLarge)
    assert parse_frame(frames[-1]) == messages[0]


# ------------------------------------------------------------------------------------------- properties
FRAME_BODIES = st.binary(max_size=3 * MAX).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))


@PROPERTY
@given(st.lists(FRAME_BODIES, max_size=12), st.data())
def test_any_chunking_yields_the_same_frames(bodies: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(body + b"\n" for body in bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]

    async def scenario() -> list[bytes | FrameTooLarge]:
        reader = asyncio.StreamReader(limit=2 * MAX)
        consumer = asyncio.ensure_future(read_all(reader))
        for chunk in chunks:
            reader.feed_data(chunk)
            await asyncio.sleep(0)
        reader.feed_eof()
        return await asyncio.wait_for(consumer, 5)

    frames = asyncio.run(scenario())
    assert len(frames) == len(bodies)
    for body, frame in zip(bodies, frames):
        if len(body) <= MAX:
            assert frame == body
        else:
            assert isinstance(frame, FrameTooLarge)
