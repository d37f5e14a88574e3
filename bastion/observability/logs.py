"""Log lines as JSON, one object a line (``--log-format json``): for a log pipeline to read rather than a person.

Each line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``; written while a client's request is
in progress, also its ``request_id``, ``identity``, ``trace_id`` and, for a call, ``server`` and ``tool`` (the facts
``bastion.observability.request_context`` keeps); a traceback in ``exception``. The JSON encoder escapes every
control character, so no text from outside (a server's stderr, a tool's name, a client's string) can end a line,
forge another or drive a terminal.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from bastion.observability.request_context import REQUEST

# Quotation marks and the line and paragraph separators too: a reader that splits on U+2028 sees no new line.
_SEPARATORS = {0x2028: "\\u2028", 0x2029: "\\u2029"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        facts = REQUEST.get()
        if facts is not None:
            line.update(facts.fields())
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        text = orjson.dumps(line, default=str).decode()
        return text if text.isascii() else text.translate(_SEPARATORS)


def _utc(created: float) -> str:
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"
