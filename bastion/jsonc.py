"""JSON with comments (``//`` and ``/* */``) and trailing commas, as VS Code's files (``.vscode/mcp.json``, its
settings) and many hand-edited Claude Desktop and Cursor files are written. One reading for every place a client's
file is read: the configuration loader (``run``, ``check``, ``serve``), ``import`` and ``client install``.

Comments and trailing commas become spaces rather than disappearing, so a real error in the rest of the file is
reported at the line and column the person sees in their editor."""

from __future__ import annotations

import json
from typing import Any


def parse_jsonc(text: str) -> Any:
    """The value ``text`` holds; ``json.JSONDecodeError`` (positions as in ``text``) when it holds none."""
    return json.loads(strip_jsonc(text))


def strip_jsonc(text: str) -> str:
    """``text`` with its comments and trailing commas blanked: the same length, line breaks kept."""
    out: list[str] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char == '"':
            end = index + 1
            while end < length and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[index:end + 1])
            index = end + 1
        elif text.startswith("//", index):
            newline = text.find("\n", index)
            end = length if newline < 0 else newline
            out.append(" " * (end - index))
            index = end
        elif text.startswith("/*", index):
            close = text.find("*/", index + 2)
            end = length if close < 0 else close + 2
            out.append("".join(c if c == "\n" else " " for c in text[index:end]))
            index = end
        elif char in "}]":
            # a comma before a closing bracket (only blanks between) becomes a blank
            back = len(out) - 1
            while back >= 0 and out[back].isspace():
                back -= 1
            if back >= 0 and out[back] == ",":
                out[back] = " "
            out.append(char)
            index += 1
        else:
            out.append(char)
            index += 1
    return "".join(out)
