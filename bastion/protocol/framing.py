"""Newline-delimited framing as a sans-I/O object: bytes in, frames out.

stdio carries one JSON-RPC message per line. Feeding the framer whatever arrived yields the complete frames in
it, so a transport needs no reader task waking per frame. A frame longer than the limit is dropped whole, even
while it is still arriving, and reported once with its size; the frames after it come through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

NEWLINE = b"\n"
CR = b"\r"


@dataclass(frozen=True, slots=True)
class Oversize:
    """A frame that exceeded the limit and was discarded; ``size`` counts its bytes without the line ending."""

    size: int
    limit: int


class LineFramer:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._partial = bytearray()
        self._discarded: int | None = None  # bytes of an oversize frame dropped so far, while dropping one

    def feed(self, data: bytes) -> list[bytes | Oversize]:
        if (data[-1:] == NEWLINE and not self._partial and self._discarded is None and len(data) <= self.max_bytes
                and 13 not in data):  # an int: `bytes in bytes` raises and catches a TypeError inside
            # The usual read: whole frames only, none of them over the limit, no line endings to strip.
            return data[:-1].split(NEWLINE)  # type: ignore[return-value]
        frames: list[bytes | Oversize] = []
        start = 0
        if self._discarded is not None:
            end = data.find(NEWLINE)
            if end < 0:
                self._discarded += len(data)
                return frames
            frames.append(Oversize(self._discarded + _strip_cr_length(data, end), self.max_bytes))
            self._discarded = None
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
            size, self._discarded = self._discarded, None
            return [Oversize(size, self.max_bytes)]
        if self._partial:
            frame = bytes(self._partial)
            self._partial.clear()
            return [self._checked(frame)]
        return []

    def _keep(self, data: bytes) -> None:
        if len(self._partial) + len(data) > self.max_bytes + 1:  # +1: a CR that may precede the newline
            self._discarded = len(self._partial) + len(data)
            self._partial.clear()
        else:
            self._partial += data

    def _checked(self, frame: bytes) -> bytes | Oversize:
        if frame.endswith(b"\r"):
            frame = frame[:-1]
        if len(frame) > self.max_bytes:
            return Oversize(len(frame), self.max_bytes)
        return frame


def _strip_cr_length(data: bytes, end: int) -> int:
    return end - 1 if end > 0 and data[end - 1 : end] == b"\r" else end
