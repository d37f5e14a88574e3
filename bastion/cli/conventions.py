"""What every ``bastion`` command shares: exit codes, the global -v/-q flags, and where logs go.

Exit codes (docs/cli.md lists them per command):

- 0: done; the answer is yes (allowed, intact, every server up).
- 1: done, and the answer is no (a tool error, a trail that does not verify, a server not available).
- 2: the command cannot run as given (a bad argument, a configuration error naming its file and key).
- 3 / 4: ``bastion policy check``'s decision: deny / approval needed.
- 126: ``bastion sandbox run`` could not start the command.
- 130: interrupted (Ctrl-C), after a single line on stderr.
- 141: stdout was closed by its reader (``bastion tools | head``), said nowhere: the reader had what it wanted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command ended by Ctrl-C
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what shells report for a writer whose pipe's reader left

# (dest, option strings, help): accepted before or after any subcommand.
GLOBAL_FLAGS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("verbose", ("-v", "--verbose"), "log debug detail and servers' stderr"),
    ("quiet", ("-q", "--quiet"), "log only warnings and errors"),
)
_GLOBAL_OPTION_STRINGS = frozenset(option for _, options, _ in GLOBAL_FLAGS for option in options)


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` -v/-q, and every subcommand under it, however deep.

    Their default is "not given" (SUPPRESS), so a flag given before the subcommand is not reset by the
    subcommand's parser; :func:`global_flags` reads them afterwards. A parser that has its own option of the
    same name and meaning (``sandbox run --quiet``) keeps it, and gets only the spellings it lacks.
    """
    for dest, options, help_text in GLOBAL_FLAGS:
        existing = [a for a in parser._actions if a.dest == dest]
        for action in existing:
            action.default = argparse.SUPPRESS
        missing = [o for o in options if o not in parser._option_string_actions]
        if missing:
            parser.add_argument(*missing, dest=dest, action="store_true", default=argparse.SUPPRESS, help=help_text)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                add_global_flags(child)


def global_flags(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``verbose`` and ``quiet`` always set (False when not given)."""
    for dest, _, _ in GLOBAL_FLAGS:
        setattr(args, dest, bool(getattr(args, dest, False)))
    return args


def split_global_flags(argv: list[str]) -> tuple[list[str], dict[str, bool]]:
    """Take -v/-q out of an argument list a subcommand parses itself (``bastion tools … -v``).

    Stops at ``--``: what follows belongs to someone else.
    """
    kept: list[str] = []
    found: dict[str, bool] = {}
    for index, argument in enumerate(argv):
        if argument == "--":
            kept.extend(argv[index:])
            break
        if argument in _GLOBAL_OPTION_STRINGS:
            found[next(dest for dest, options, _ in GLOBAL_FLAGS if argument in options)] = True
        else:
            kept.append(argument)
    return kept, found


# What a log record shows escaped: C0 and C1 controls but the newline, DEL and the Unicode line and paragraph
# separators. A value from outside (a token's subject, a tool's name, a server's output) could otherwise move the
# cursor, rewrite a line or drive the terminal that shows the log.
_ESCAPED: dict[int, str] = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPED.update({ord("\r"): "\\r", ord("\t"): "\\t", 0x2028: "\\u2028", 0x2029: "\\u2029"})
# A newline continues the record on an indented line: no line of a record can read as a record of its own.
_ESCAPED[ord("\n")] = "\n" + " " * 4


def escaped_for_log(text: str) -> str:
    """``text`` as a log record shows it: controls written as escapes, further lines indented."""
    return text if text.isprintable() else text.translate(_ESCAPED)


class RecordFormatter(logging.Formatter):
    """Each record's message, and a traceback that follows it, through ``escaped_for_log``: an exception's text may
    quote what a client or a server sent as well."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped_for_log(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return escaped_for_log(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return escaped_for_log(super().formatStack(stack_info))


LOG_FORMATS = ("human", "json")


def configure_logging(verbose: bool = False, quiet: bool = False, log_format: str = "human") -> None:
    """Everything logged goes to stderr: on stdio, stdout is the protocol channel. ``log_format`` "json" writes one
    JSON object a line (``bastion.observability.logs``), for a log pipeline rather than a person."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        from bastion.observability.logs import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(RecordFormatter("bastion %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
