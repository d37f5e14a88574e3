"""Newline-delimited framing as a sans-I/O object: bytes in, frames out.

stdio carries one JSON-RPC message per line. Feeding the framer whatever arrived yields the complete frames in
it, so a transport needs no reader task waking per frame. A frame longer than the limit is dropped whole, even
while it is still arriving, and reported once with its size and its first and last EDGE bytes (where a message's
id and kind usually are: ``jsonrpc.edge_members``); the frames after it come through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NEWLINE = b"\n"
CR = b"\r"
EDGE = 256  # bytes kept of each end of a frame over the limit


@dataclass(frozen=True, slots=True)
class Oversize:
    """A frame that exceeded the limit and was discarded; ``size`` counts its bytes without the line ending.

    ``head`` and ``tail`` are its first and last ``EDGE`` bytes; ``whole`` is False when the stream ended before
    the frame did (``tail`` is then where it was cut, not its end).
    """

    size: int
    limit: int
    head: bytes = field(default=b"", compare=False, repr=False)
    tail: bytes = field(default=b"", compare=False, repr=False)
    whole: bool = field(default=True, compare=False)


class LineFramer:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._partial = bytearray()
        self._discarded: int | None = None  # bytes of an oversize frame dropped so far, while dropping one
        # The first EDGE bytes of the frame being dropped, and its last EDGE + 1 (a CR before its newline among them).
        self._head = b""
        self._tail = b""

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        if (data[-1:] == NEWLINE and not self._partial and self._discarded is None and len(data) <= self.max_bytes
                and 13 not in data):  # an int: `bytes in bytes` raises and catches a TypeError inside
            # The usual read: whole frames only, none of them over the limit, no line endings to strip.
            return data[:-1].split(NEWLINE)  # type: ignore[return-value]
        frames: list[bytes | Oversize] = []
        start = 0
        if self._discarded is not None:
            end = data.find(NEWLINE)
            stop = len(data) if end < 0 else end
            self._discarded += stop
            if len(self._head) < EDGE:
                self._head += data[:min(stop, EDGE - len(self._head))]
            self._tail = (self._tail + data[max(0, stop - EDGE - 1):stop])[-EDGE - 1:]
            if end < 0:
                return frames
            frames.append(self._dropped(whole=True))
            start = end + 1
        elif self._partial:
            end = data.find(NEWLINE)
            if end < 0:
                self._keep(data)
                return frames
            self._partial += data[:end]
            frames.append(self._checked(bytes(self._partial)))
            self._partial.clear()
            start = end + 1
        find = data.find
        while (end := find(NEWLINE, start)) >= 0:
            frames.append(self._checked(data[start:end]))
            start = end + 1
        if start < len(data):
            self._keep(data[start:])
        return frames

    def eof(self) -> list[bytes | Oversize]:
        """What is left when the stream ends: a last frame without its newline, or the oversize one being dropped."""
        if self._discarded is not None:
            return [self._dropped(whole=False)]
        if self._partial:
            frame = bytes(self._partial)
            self._partial.clear()
            return [self._checked(frame)]
        return []

    def _keep(self, data: bytes) -> None:
        if len(self._partial) + len(data) > self.max_bytes + 1:  # +1: a CR that may precede the newline
            self._discarded = len(self._partial) + len(data)
            self._head = (bytes(self._partial[:EDGE]) + data[:EDGE])[:EDGE]
            self._tail = (bytes(self._partial[-EDGE - 1:]) + data[-EDGE - 1:])[-EDGE - 1:]  # and a CR, if it ends so
            self._partial.clear()
        else:
            self._partial += data

    def _dropped(self, *, whole: bool) -> Oversize:
        """The frame being dropped, ended by its newline (``whole``) or by the end of the stream."""
        size, head, tail = self._discarded or 0, self._head, self._tail
        self._discarded, self._head, self._tail = None, b"", b""
        if whole and tail.endswith(CR):
            size -= 1
            tail = tail[:-1]
            head = head[:size]
        return Oversize(size, self.max_bytes, head, tail[-EDGE:], whole)

    def _checked(self, frame: bytes) -> bytes | Oversize:
        if frame.endswith(b"\r"):
            frame = frame[:-1]
        if len(frame) > self.max_bytes:
            return Oversize(len(frame), self.max_bytes, frame[:EDGE], frame[-EDGE:])
        return frame
