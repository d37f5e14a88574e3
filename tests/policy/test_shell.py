"""Shell guard: every command-injection payload refused; quoted metacharacters in free text admitted."""

from __future__ import annotations

import subprocess

import pytest

from bastion.policy.guards import ShellRules, check_shell_argument
from tests.policy.payloads import command_payloads

WORD = ShellRules(mode="argument", positional=True)
COMMAND = ShellRules(mode="command", allowed_commands=("git", "ls", "grep"))


def test_every_payload_is_refused_as_a_shell_bound_argument() -> None:
    # A bare "{cmd}" line fills to "id": a plain word is a legitimate argument value, so only the
    # template lines with injection syntax are expected here (the bare command is the command guard's job).
    admitted = [p for p in command_payloads() if check_shell_argument(p, WORD).ok and p not in ("id", "/usr/bin/id")]
    assert admitted == []


def test_every_payload_is_refused_as_a_command_line() -> None:
    admitted = [p for p in command_payloads() if check_shell_argument(p, COMMAND).ok]
    assert admitted == []


def test_payloads_appended_to_an_allowed_command_are_refused_unless_quoted() -> None:
    admitted = []
    for payload in command_payloads():
        line = f"git log {payload}"
        if check_shell_argument(line, COMMAND).ok:
            admitted.append(payload)
    # Whatever passes must be inert: sh sees no operator outside quotes, so it all stays git's arguments.
    import shlex

    assert admitted, "quoted payloads are plain text and should pass"
    for payload in admitted:
        lexer = shlex.shlex(f"git log {payload}", posix=True, punctuation_chars=True)
        operators = [t for t in lexer if t and set(t) <= set("();<>|&")]
        assert operators == [], payload


@pytest.mark.parametrize(
    "value",
    ["main", "feature/login-form", "v1.2.3", "release_2024.10", "README.md", "naïve-branch", "日本語", "a=b", "user@example.com", "50%"],
)
def test_benign_words(value: str) -> None:
    assert check_shell_argument(value, WORD).ok, check_shell_argument(value, WORD).reason


@pytest.mark.parametrize(
    "value",
    [
        "git status",
        "git commit -m 'fix: handle a; b | c && d > e'",
        'git commit -m "release (v2): tweaks & fixes; see #12"',
        "grep -n 'a|b' README.md",
        "ls -la docs",
        "git log --format='%H %s'",
    ],
)
def test_quoted_metacharacters_in_free_text_pass_in_command_mode(value: str) -> None:
    assert check_shell_argument(value, COMMAND).ok, check_shell_argument(value, COMMAND).reason


@pytest.mark.parametrize(
    "value, reason",
    [
        ("--upload-pack=touch", "option"),
        ("-oProxyCommand=id", "option"),
        ("a b", "whitespace"),
        ("$(id)", "metacharacters"),
        ("x%0Aid", "metacharacters"),
    ],
)
def test_word_refusals(value: str, reason: str) -> None:
    verdict = check_shell_argument(value, WORD)
    assert not verdict.ok and reason in (verdict.reason or "")


@pytest.mark.parametrize(
    "value, reason",
    [
        ('git commit -m "$(id)"', "double quotes"),
        ("git commit -m \"`id`\"", "double quotes"),
        ("git log; id", "operators"),
        ("git log 'unterminated", "unterminated"),
        ("rm -rf /", "not allowed"),
        ("git log \\; id", "backslash"),
    ],
)
def test_command_refusals(value: str, reason: str) -> None:
    verdict = check_shell_argument(value, COMMAND)
    assert not verdict.ok and reason in (verdict.reason or "")


def test_leading_dash_allowed_when_not_positional() -> None:
    assert check_shell_argument("--oneline", ShellRules(mode="argument")).ok
    assert check_shell_argument(7, WORD).ok


@pytest.mark.parametrize("word", ["~", "~root", "~/.ssh/id_rsa", "x=~", "PATH=/bin:~/bin", "--to=~root"])
def test_a_word_the_shell_expands_to_a_home_directory_is_refused(word: str) -> None:
    # Found by tests/fuzz/fuzz_arg_guards.py: "~root" passed as a plain word. bash expands it (and after the = or a
    # : of an assignment-like word) to a home directory: the value the server's command gets is not the one checked.
    shown = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True, check=True).stdout
    if word != "--to=~root":  # bash leaves this one alone; dash and others differ: refused all the same
        assert shown != word
    assert not check_shell_argument(word, ShellRules(mode="argument")).ok


@pytest.mark.parametrize("word", ["a~b", "v1.0~rc1", "x~", "name~2"])
def test_a_tilde_the_shell_leaves_alone_is_admitted(word: str) -> None:
    assert subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True).stdout == word
    assert check_shell_argument(word, ShellRules(mode="argument")).ok
