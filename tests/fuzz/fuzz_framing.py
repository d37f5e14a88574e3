"""The stdio frame reader (``LineFramer``): whatever the bytes and however they are cut into reads, the frames
are those of a plain model of newline framing (a line without its line ending; a line over the limit reported
as ``Oversize`` with its size and its edges), the same whichever the cuts."""

from __future__ import annotations

import atheris

from bastion.protocol.framing import EDGE, LineFramer, Oversize


def model(data: bytes, limit: int) -> list[tuple]:
    """What a reader of the whole stream at once would say, as comparable tuples."""
    *lines, last = data.split(b"\n")
    out = []
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        out.append(_frame(line, limit, whole=True))
    if last:
        if len(last) > limit + 1:  # dropped while still arriving: its size as it was when the stream ended
            out.append(("over", len(last), last[:EDGE], last[-EDGE:], False))
        else:
            out.append(_frame(last[:-1] if last.endswith(b"\r") else last, limit, whole=True))
    return out


def _frame(line: bytes, limit: int, whole: bool) -> tuple:
    if len(line) > limit:
        return ("over", len(line), line[:EDGE], line[-EDGE:], whole)
    return ("frame", line)


def _seen(frames: list) -> list[tuple]:
    return [("over", f.size, f.head, f.tail, f.whole) if type(f) is Oversize else ("frame", bytes(f)) for f in frames]


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    limit = fdp.ConsumeIntInRange(1, 600)
    cuts = [fdp.ConsumeIntInRange(0, 700) for _ in range(fdp.ConsumeIntInRange(0, 8))]
    stream = fdp.ConsumeBytes(fdp.remaining_bytes())
    framer = LineFramer(limit)
    frames: list = []
    at = 0
    for size in cuts:
        chunk = stream[at:at + size]
        at += size
        if chunk:  # a transport never hands over an empty read
            frames.extend(framer.feed(chunk))
    if stream[at:]:
        frames.extend(framer.feed(stream[at:]))
    frames.extend(framer.eof())
    assert framer.eof() == [], "eof twice gives nothing more"
    expected = model(stream, limit)
    assert _seen(frames) == expected, (limit, cuts, stream[:200], _seen(frames)[:3], expected[:3])
