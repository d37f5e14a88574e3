"""Pinned tool definitions: what a reviewed tool looked like, so a policy can tell when it changes.

A pins file maps ``server/tool`` to the SHA-256 of the tool's definition as its server sent it, in
canonical JSON (keys sorted at every depth) and without its name, which the key already holds. A tool is
*pinned* while its current definition hashes to its pin. A server that quietly rewrites a tool's
description or schema after review (a "rug pull") makes it unpinned, and Cedar sees that as
``resource.pinned == false``. ``bastion tools pin CONFIG`` writes the file from the live catalog.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

from bastion.model import ToolEntry
from bastion.policy.config import PolicyStartError

_PREFIX = "sha256:"


class PinsFileError(PolicyStartError, ValueError):
    """A pins file that cannot be used; the message names the file and what to do."""


def definition_digest(definition: Mapping[str, Any]) -> str:
    body = {key: value for key, value in definition.items() if key != "name"}
    return _PREFIX + hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def pin_key(entry: ToolEntry) -> str:
    return f"{entry.server}/{entry.original_name}"


def pins_of(entries: Iterable[ToolEntry]) -> dict[str, str]:
    """The pins of the given catalog entries, by ``server/tool``."""
    return {pin_key(entry): definition_digest(entry.definition) for entry in entries}


def write_pins(path: Path, pins: Mapping[str, str]) -> None:
    """Write ``pins`` (sorted, one per line) atomically: a reader never sees half a file."""
    data = orjson.dumps(dict(sorted(pins.items())), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def read_pins(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PinsFileError(f"{path}: no pins file; write it with `bastion tools pin CONFIG`") from None
    except OSError as error:
        raise PinsFileError(f"{path}: cannot read the pins file: {error.strerror}") from None
    try:
        pins = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise PinsFileError(f"{path}: not JSON ({error}); write it again with `bastion tools pin CONFIG`") from None
    if not isinstance(pins, dict):
        raise PinsFileError(f'{path}: must be an object of "server/tool": "sha256:..." pairs')
    for key, value in pins.items():
        if "/" not in key or not isinstance(value, str) or not value.startswith(_PREFIX):
            raise PinsFileError(f'{path}: key "{key}": expected "server/tool": "sha256:<hex>"')
    return pins


class PinnedTools:
    """``pinned(entry)``: whether a catalog entry's definition is the one pinned for it."""

    def __init__(self, pins: Mapping[str, str]) -> None:
        self._pins = dict(pins)

    def __call__(self, entry: ToolEntry) -> bool:
        pin = self._pins.get(pin_key(entry))
        return pin is not None and pin == definition_digest(entry.definition)
