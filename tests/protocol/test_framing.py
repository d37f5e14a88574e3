"""Newline-delimited framing (LineFramer) over byte streams: split reads, CRLF, the size limit, recovery after bad
frames, and the stdio receiver that feeds it from a real pipe."""

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
from bastion.protocol.framing import EDGE, LineFramer, Oversize
from bastion.transport.stdio import FrameReceiver, WriteBatch

from tests.properties import PROPERTY

MAX = 64  # frame limit used throughout; the reader's own buffer limit is set per test


def reader_with(data: bytes, *, limit: int = 4 * MAX, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def read_all(reader: asyncio.StreamReader, max_bytes: int = MAX) -> list[bytes | Oversize]:
    """Every frame until end of stream, read as an upstream connection reads: whatever arrived, then framed."""
    framer = LineFramer(max_bytes)
    out: list[bytes | Oversize] = []
    while True:
        data = await reader.read(reader._limit)  # the reader's buffer size stands for a read's size
        out.extend(framer.feed(data) if data else framer.eof())
        if not data:
            return out


async def test_frames_are_split_on_newlines() -> None:
    assert await read_all(reader_with(b"a\nbb\nccc\n")) == [b"a", b"bb", b"ccc"]


async def test_crlf_line_endings_are_stripped() -> None:
    assert await read_all(reader_with(b"a\r\nb\nc\r\n")) == [b"a", b"b", b"c"]


async def test_last_frame_may_lack_its_newline() -> None:
    assert await read_all(reader_with(b"a\nlast")) == [b"a", b"last"]


async def test_empty_lines_are_empty_frames() -> None:
    assert await read_all(reader_with(b"\n\na\n")) == [b"", b"", b"a"]


def test_end_of_stream_yields_nothing_more() -> None:
    framer = LineFramer(MAX)
    assert framer.eof() == []
    assert framer.eof() == []


def test_a_frame_waits_for_its_newline() -> None:
    framer = LineFramer(MAX)
    assert framer.feed(b'{"jsonrpc":') == []
    assert framer.feed(b'"2.0","method":"x"}\nnext') == [b'{"jsonrpc":"2.0","method":"x"}']
    assert framer.eof() == [b"next"]


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
    assert isinstance(too_large, Oversize)
    assert too_large.limit == MAX
    assert MAX < too_large.size <= size


async def test_oversized_frame_arriving_in_small_chunks_is_discarded() -> None:
    reader = asyncio.StreamReader(limit=MAX)
    consumer = asyncio.ensure_future(read_all(reader))
    for chunk in [b"a\n"] + [b"z" * 7] * 100 + [b"\nb\n"]:
        reader.feed_data(chunk)
        await asyncio.sleep(0)
    reader.feed_eof()
    frames = await asyncio.wait_for(consumer, 5)
    assert frames[0] == b"a" and frames[2:] == [b"b"]
    assert isinstance(frames[1], Oversize)


@pytest.mark.parametrize("reader_limit", [4 * MAX, MAX // 2])
async def test_oversized_last_frame_without_newline(reader_limit: int) -> None:
    frames = await read_all(reader_with(b"a\n" + b"y" * (10 * MAX), limit=reader_limit))
    assert frames[0] == b"a" and len(frames) == 2 and isinstance(frames[1], Oversize)


async def test_last_frame_one_byte_over_the_limit_is_refused() -> None:
    assert await read_all(reader_with(b"y" * (MAX + 1))) == [Oversize(MAX + 1, MAX)]


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
        if isinstance(frame, Oversize):
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
    frames: list[bytes | Oversize] = []
    ended = asyncio.Event()
    receiver = FrameReceiver(LineFramer(100_000), frames.append, ended.set, WriteBatch())
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        transport, _ = await loop.connect_read_pipe(lambda: receiver, source)
        try:
            messages = [Request(i, "tools/call", {"name": "echo", "arguments": {"text": "x" * (i * 997)}}) for i in range(1, 40)]
            payload = b"".join(encode(m) for m in messages) + b"y" * 200_000 + b"\n" + encode(messages[0])

            def write_in_odd_pieces() -> None:
                with os.fdopen(write_fd, "wb", buffering=0) as sink:
                    for start in range(0, len(payload), 4093):
                        sink.write(payload[start:start + 4093])

            writer = asyncio.ensure_future(asyncio.to_thread(write_in_odd_pieces))
            await asyncio.wait_for(ended.wait(), 30)
            await writer
        finally:
            transport.close()
    assert [parse_frame(f) for f in frames[:-2]] == messages
    assert isinstance(frames[-2], Oversize)
    assert parse_frame(frames[-1]) == messages[0]


# ------------------------------------------------------------------------------------------- properties
FRAME_BODIES = st.binary(max_size=3 * MAX).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))


@PROPERTY
@given(st.lists(FRAME_BODIES, max_size=12), st.data())
def test_any_chunking_yields_the_same_frames(bodies: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(body + b"\n" for body in bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]

    async def scenario() -> list[bytes | Oversize]:
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
            assert isinstance(frame, Oversize)


def _numbered(size: int) -> bytes:
    """``size`` bytes that repeat nowhere in a way a slice taken at the wrong offset could match."""
    return b",".join(str(i).encode() for i in range(size))[:size]


@PROPERTY
@given(size=st.integers(MAX + 1, 12 * EDGE), cuts=st.lists(st.integers(1, 12 * EDGE), max_size=12),
       crlf=st.booleans())
def test_an_oversize_frame_keeps_its_first_and_last_bytes_however_it_arrives(size: int, cuts: list[int],
                                                                            crlf: bool) -> None:
    frame = _numbered(size)
    stream = b"a\n" + frame + (b"\r\n" if crlf else b"\n") + b"b\n"
    framer = LineFramer(MAX)
    frames: list[bytes | Oversize] = []
    previous = 0
    for cut in sorted({cut for cut in cuts if cut < len(stream)}) + [len(stream)]:
        frames += framer.feed(stream[previous:cut])
        previous = cut
    assert frames == [b"a", Oversize(size, MAX), b"b"]
    dropped = frames[1]
    assert isinstance(dropped, Oversize) and dropped.whole
    assert dropped.head == frame[:EDGE] and dropped.tail == frame[-EDGE:]


def test_an_oversize_frame_cut_by_the_end_of_the_stream_says_so() -> None:
    frame = _numbered(4 * EDGE)
    framer = LineFramer(MAX)
    assert framer.feed(b"a\n" + frame[:3 * EDGE]) == [b"a"]
    assert framer.feed(frame[3 * EDGE:]) == []
    [dropped] = framer.eof()
    assert isinstance(dropped, Oversize) and not dropped.whole and dropped.size == len(frame)
    assert dropped.head == frame[:EDGE] and dropped.tail == frame[-EDGE:]
