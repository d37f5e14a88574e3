"""Shell guard for arguments a server hands to a shell.

Two kinds of value:
- ``argument``: one word placed into a command line (a branch name, a file name). Any character the shell
  treats specially is refused, and so is whitespace unless allowed (it splits the word in two), and a
  leading dash when the argument is declared positional (``-oProxyCommand=...`` option injection).
- ``command``: a whole command line. It is tokenised like POSIX ``sh``: operators outside quotes are refused,
  ``$`` and backquotes are refused even inside double quotes (they still expand there), and text inside
  single quotes is literal, so ``git commit -m 'a; b | c'`` passes. The program may be restricted to a list.

Values are also checked after percent-decoding, because ``%0A`` becomes a newline for servers that decode.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from bastion.policy.decision import PASS, GuardResult, refuse
from bastion.policy.guards.decoding import compatibility_form, decode_fully

# ``^`` is the Thompson/Bourne pipe and the cmd.exe escape; quotes and backslash re-open quoting.
_ARGUMENT_METACHARACTERS = frozenset(";&|`$()<>^'\"\\\n\r\x00{}*?[]!#")
_OPERATORS_OUTSIDE_QUOTES = frozenset(";&|`$()<>^\n\r\x00")
_EXPANDING_IN_DOUBLE_QUOTES = frozenset("`$\n\r\x00")
_WHITESPACE = re.compile(r"\s")
# Where a shell expands an unquoted tilde to a home directory: a word's start, and (bash) after the = or a : of a
# word shaped like an assignment (``a=~``, ``PATH=x:~``).
_TILDE_PREFIX = re.compile(r"(?:^|[=:])~")


@dataclass(frozen=True, slots=True)
class ShellRules:
    mode: str = "argument"  # "argument" | "command"
    positional: bool = False
    allow_whitespace: bool = False
    allowed_commands: tuple[str, ...] = ()  # empty: any program (command mode)


def _readings(value: str) -> tuple[str, ...]:
    decoded = decode_fully(value)
    folded = compatibility_form(decoded)
    return tuple(dict.fromkeys((value, decoded, folded)))


def _check_word(value: str, rules: ShellRules) -> str | None:
    if any(c in _ARGUMENT_METACHARACTERS for c in value):
        return "the argument contains shell metacharacters"
    if _TILDE_PREFIX.search(value):
        return "the argument would be expanded to a home directory (~)"
    if not rules.allow_whitespace and _WHITESPACE.search(value):
        return "the argument contains whitespace"
    if rules.positional and value.lstrip().startswith("-"):
        return "the argument would be read as an option"
    return None


def _unquoted_operator(command: str) -> str | None:
    quote = ""
    escaped = False
    for c in command:
        if escaped:
            if c in "\n\r\x00":
                return "the command contains a line break"
            escaped = False
            continue
        if quote == "'":
            if c == "'":
                quote = ""
            elif c in "\x00":
                return "the command contains a NUL byte"
            continue
        if c == "\\":
            if quote == "":
                return "the command contains a backslash escape"
            escaped = True
            continue
        if quote == '"':
            if c == '"':
                quote = ""
            elif c in _EXPANDING_IN_DOUBLE_QUOTES:
                return "the command expands text inside double quotes"
            continue
        if c in "'\"":
            quote = c
        elif c in _OPERATORS_OUTSIDE_QUOTES:
            return "the command contains shell operators"
    if quote:
        return "the command has an unterminated quote"
    return None


def _check_command(value: str, rules: ShellRules) -> str | None:
    problem = _unquoted_operator(value)
    if problem:
        return problem
    try:
        words = shlex.split(value, posix=True)
    except ValueError:
        return "the command cannot be parsed"
    if not words:
        return "the command is empty"
    if rules.allowed_commands and words[0] not in rules.allowed_commands:
        return "the program is not allowed"
    return None


def check_shell_argument(value: object, rules: ShellRules) -> GuardResult:
    if not isinstance(value, str):
        # Numbers and booleans cannot carry shell syntax.
        return PASS if isinstance(value, (int, float, bool)) else refuse("the argument must be a string")
    check = _check_command if rules.mode == "command" else _check_word
    for reading in _readings(value):
        problem = check(reading, rules)
        if problem:
            return refuse(problem)
    return PASS
