"""The shared attack payload lists, read in place from ../shared/data/attacks/ (relative to the repo root)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ROOT.parent / "shared" / "data" / "attacks"

TRAVERSAL_FILES = (
    "fuzzdb-traversals-8-deep-exotic-encoding.txt",
    "patt-deep_traversal.txt",
    "patt-directory_traversal.txt",
)
COMMAND_FILES = (
    "fuzzdb-command-injection-template.txt",
    "fuzzdb-shell-delimiters.txt",
    "fuzzdb-shell-operators.txt",
    "patt-command-execution-unix.txt",
)
FILES_TO_REACH = ("etc/passwd", "WINDOWS/win.ini", "../secret.txt")
COMMANDS_TO_RUN = ("cat /etc/passwd", "id", "/usr/bin/id")


def lines(name: str) -> list[str]:
    text = (ATTACKS / name).read_text(encoding="utf-8", errors="surrogateescape")
    return [line for line in text.splitlines() if line]


def traversal_payloads() -> list[str]:
    out = []
    for name in TRAVERSAL_FILES:
        for line in lines(name):
            out.extend(line.replace("{FILE}", target) for target in FILES_TO_REACH)
    return sorted(set(out))


def command_payloads() -> list[str]:
    out = []
    for name in COMMAND_FILES:
        for line in lines(name):
            out.extend(line.replace("{cmd}", command) for command in COMMANDS_TO_RUN)
    return sorted(set(out))
