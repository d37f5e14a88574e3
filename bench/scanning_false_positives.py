"""What the secret and personal-data scanner finds in ordinary content, where nearly every finding is a false positive
(or a real address an author left in a file): the source and documentation of installed packages, git history, tool
catalogs, this project's own docs. Each file is scanned as one text, as a tool result would be.

Prints, per corpus: its size, the findings per kind, findings per MB, and the scanning speed; with ``--show`` the
line around each finding (for people classifying them; never run it on content you must not print).

Usage: .venv/bin/python bench/scanning_false_positives.py [--json] [--show] [--limit-mb N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
ROUTING = REPO_ROOT.parent / "shared" / "data" / "routing"
SOURCE_SUFFIXES = {".py", ".pyi", ".js", ".ts", ".c", ".h", ".toml", ".cfg", ".ini", ".yaml", ".yml"}
DOC_SUFFIXES = {".md", ".rst", ".txt", ".html", ".htm"}


def files_under(root: Path, suffixes: set[str], limit: int) -> Iterator[Path]:
    total = 0
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() in suffixes and path.is_file():
            size = path.stat().st_size
            if size > 4 << 20:
                continue
            total += size
            if total > limit:
                return
            yield path


def git_history(repo: Path) -> Iterator[tuple[str, str]]:
    """The repository's log with the files each commit changed, a commit at a time (what a git server's log tool
    answers; its patches are left out because this one's carry the test fixtures' deliberate secrets)."""
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        return
    log = subprocess.run(["git", "-C", str(repo), "log", "--stat", "--format=fuller", "-n", "2000"], capture_output=True,
                         timeout=300).stdout.decode(errors="replace")
    for index, commit in enumerate(log.split("\ncommit ")):
        yield f"{repo.name}#{index}", commit


def corpora(limit: int) -> dict[str, Iterator[tuple[str, str]]]:
    def read(paths: Iterator[Path]) -> Iterator[tuple[str, str]]:
        for path in paths:
            yield str(path), path.read_text(encoding="utf-8", errors="replace")

    return {
        "installed packages, source": read(files_under(SITE_PACKAGES, SOURCE_SUFFIXES, limit)),
        "installed packages, docs and metadata": read(files_under(SITE_PACKAGES, DOC_SUFFIXES, limit)),
        "git history (this repository, git log --stat)": git_history(REPO_ROOT),
        "tool catalogs (shared/data/routing)": read(files_under(ROUTING, {".json", ".jsonl"}, limit)),
        "Bastion's docs": read(files_under(REPO_ROOT / "docs", {".md"}, limit)),
    }


def measure(limit: int, show: bool) -> list[dict]:
    from bastion.guardrails.scanning import default_scanner

    scanner = default_scanner()
    rows = []
    for name, texts in corpora(limit).items():
        kinds: Counter[str] = Counter()
        size = files = 0
        elapsed = 0.0
        for label, text in texts:
            files += 1
            size += len(text.encode("utf-8", "surrogatepass"))
            started = time.perf_counter()
            found = scanner.find_in(text)
            elapsed += time.perf_counter() - started
            for detector, value in found:
                kinds[detector.kind] += 1
                if show:
                    at = text.find(value)
                    around = text[max(0, at - 60):at + len(value) + 30].replace("\n", "⏎")
                    print(f"{name}: {label}: {detector.kind} ({detector.rule}): {around}", file=sys.stderr)
        megabytes = size / 1e6
        rows.append({"corpus": name, "files": files, "mb": round(megabytes, 2), "findings": dict(kinds.most_common()),
                     "per_mb": round(sum(kinds.values()) / megabytes, 2) if megabytes else 0.0,
                     "mb_per_s": round(megabytes / elapsed, 1) if elapsed else None})
    return rows


def render(rows: list[dict]) -> str:
    lines = ["| corpus | files | MB | findings per MB | findings by kind | scanned MB/s |", "|---|---|---|---|---|---|"]
    for row in rows:
        kinds = ", ".join(f"{kind} {count}" for kind, count in row["findings"].items()) or "none"
        lines.append(f"| {row['corpus']} | {row['files']} | {row['mb']} | {row['per_mb']} | {kinds} | "
                     f"{row['mb_per_s']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--show", action="store_true", help="print the line around each finding to stderr")
    parser.add_argument("--limit-mb", type=float, default=40.0, help="at most this much of each file corpus")
    options = parser.parse_args(argv)
    rows = measure(int(options.limit_mb * 1e6), options.show)
    print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() if options.json else render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
