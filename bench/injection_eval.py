"""Detection rate and false positives of the prompt-injection scan, per corpus.

    python bench/injection_eval.py [--json] [--misses N]

Reads the labelled corpora of data/guardrails/ (public attack sets and their benign texts; see the README there),
the BFCL tool catalog of ../shared/data/routing/ when it is present, and ordinary tool outputs made on this machine
(this repository's git log, source files and package documents of the installed packages). Definitions are scanned as
the metadata guardrail scans them (``scan_definition``), outputs as the output guardrail does (``scan_text``). Prints
one row per corpus: how many texts, how many flagged, and the rate (detection for attacks, false positives for benign
ones); ``--misses N`` prints up to N missed attacks and N false positives of each corpus, to tune the rules by.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bastion.guardrails.injection import scan_definition, scan_text  # noqa: E402

DATA = ROOT / "data" / "guardrails"
BFCL = ROOT.parent / "shared" / "data" / "routing" / "bfcl" / "tools.jsonl"
TAG_BASE = 0xE0000


@dataclass
class Sample:
    corpus: str
    label: int
    place: str  # "metadata" or "output"
    text: str = ""
    definition: dict | None = None
    id: str = ""


@dataclass
class Row:
    corpus: str
    label: int
    place: str
    total: int = 0
    flagged: int = 0
    rules: Counter = field(default_factory=Counter)
    misses: list = field(default_factory=list)


def committed_corpora() -> Iterator[Sample]:
    for path in sorted(DATA.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("guardrail", "output_injection") != "output_injection":
                continue  # a case for another guardrail (personal data, consent, deputy): bench/output_attacks.py
            if "servers" in record or record.get("kind") == "instructions":
                continue  # a set of servers, or a server's instructions: bench/definition_attacks.py reads those
            yield Sample(record["corpus"], record["label"], record["place"], record["text"],
                         definition=record.get("definition"), id=record["id"])


def bfcl_tools() -> list[dict]:
    if not BFCL.exists():
        return []
    return [json.loads(line) for line in BFCL.read_text().splitlines() if line.strip()]


def agentdojo_goals() -> list[str]:
    """The plain goals of AgentDojo's injection tasks, recovered from its 'direct' attack ("TODO: {goal}")."""
    goals = []
    for line in (DATA / "agentdojo.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "/direct/" in record["id"]:
            goals.append(record["text"].rsplit("TODO: ", 1)[1])
    return goals


def catalog_samples() -> Iterator[Sample]:
    """BFCL's 1,233 tools as benign definitions; the same tools poisoned as MCPTox builds its cases (a malicious
    instruction appended to a real tool's description), with AgentDojo's goals as the instructions: plainly, and
    hidden in Unicode tag characters."""
    tools = bfcl_tools()
    for tool in tools:
        yield Sample("bfcl-catalog", 0, "metadata", definition={k: tool[k] for k in ("name", "description", "inputSchema")
                                                                  if k in tool}, id=tool["name"])
    if not tools:
        return
    pick = random.Random(19)
    for index, goal in enumerate(agentdojo_goals()):
        tool = pick.choice(tools)
        plain = {"name": tool["name"], "description": f"{tool['description']} {goal}", "inputSchema": tool["inputSchema"]}
        yield Sample("bfcl+agentdojo-goal", 1, "metadata", definition=plain, id=f"{tool['name']}/{index}")
        hidden = "".join(chr(TAG_BASE + ord(c)) for c in goal if ord(c) < 0x80)
        smuggled = {**plain, "description": f"{tool['description']}{hidden}"}
        yield Sample("bfcl+hidden-goal", 1, "metadata", definition=smuggled, id=f"{tool['name']}/{index}")


def ordinary_outputs(limit: int = 400) -> Iterator[Sample]:
    """Tool outputs of everyday work, made here: git log pages, source files, package documents."""
    log = subprocess.run(["git", "-C", str(ROOT), "log", "--stat", "-n", "600"], capture_output=True, text=True).stdout
    pages = log.split("\ncommit ")
    for index in range(0, len(pages), 10):
        yield Sample("git-log", 0, "output", "\ncommit ".join(pages[index:index + 10]), id=f"page-{index // 10}")
    site = Path(sysconfig.get_paths()["purelib"])
    pick = random.Random(19)
    sources = sorted(site.glob("*/**/*.py"))
    for path in pick.sample(sources, min(limit, len(sources))):
        text = path.read_text(errors="replace")[:200_000]
        if text.strip():
            yield Sample("python-sources", 0, "output", text, id=str(path.relative_to(site)))
    documents = sorted([*site.glob("*.dist-info/METADATA"), *site.glob("**/README*.md")])
    for path in pick.sample(documents, min(limit, len(documents))):
        yield Sample("package-documents", 0, "output", path.read_text(errors="replace")[:200_000],
                     id=str(path.relative_to(site)))


def evaluate(samples: Iterator[Sample], misses: int) -> tuple[list[Row], float, int]:
    rows: dict[tuple[str, int, str], Row] = {}
    started = time.perf_counter()
    scanned = 0
    for sample in samples:
        if sample.definition is not None:
            verdict = scan_definition(sample.definition).verdict
            scanned += len(json.dumps(sample.definition))
        elif sample.place == "metadata":
            verdict = scan_definition({"name": sample.id, "description": sample.text}).verdict
            scanned += len(sample.text)
        else:
            verdict = scan_text(sample.text)
            scanned += len(sample.text)
        row = rows.setdefault((sample.corpus, sample.label, sample.place),
                              Row(sample.corpus, sample.label, sample.place))
        row.total += 1
        if verdict.flagged:
            row.flagged += 1
            row.rules.update(verdict.rules)
        wrong = verdict.flagged != bool(sample.label)
        if wrong and len(row.misses) < misses:
            text = sample.text or json.dumps(sample.definition)
            spans = [f for f in verdict.findings if f.end > f.start]
            if spans and sample.text:  # where a false positive matched, to see why
                text = " … ".join(text[max(0, f.start - 80):f.end + 80] for f in spans)
            row.misses.append((sample.id, verdict.rules, text[:400]))
    return list(rows.values()), time.perf_counter() - started, scanned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--misses", type=int, default=0, help="show up to N wrong verdicts per corpus")
    args = parser.parse_args()

    def everything() -> Iterator[Sample]:
        yield from committed_corpora()
        yield from catalog_samples()
        yield from ordinary_outputs()

    rows, seconds, scanned = evaluate(everything(), args.misses)
    rows.sort(key=lambda r: (r.place, -r.label, r.corpus))
    if args.json:
        print(json.dumps([{"corpus": r.corpus, "label": "attack" if r.label else "benign", "place": r.place,
                           "texts": r.total, "flagged": r.flagged, "rate": round(r.flagged / r.total, 4)}
                          for r in rows], indent=1))
        return
    print(f"{'corpus':<26} {'place':<9} {'kind':<7} {'texts':>6} {'flagged':>8} {'rate':>7}  what the rate is")
    for r in rows:
        rate = r.flagged / r.total if r.total else 0.0
        meaning = "detected" if r.label else "false positives"
        print(f"{r.corpus:<26} {r.place:<9} {'attack' if r.label else 'benign':<7} {r.total:>6} {r.flagged:>8} "
              f"{rate:>7.1%}  {meaning}")
    attacks = [r for r in rows if r.label]
    benign = [r for r in rows if not r.label]
    for name, group in (("attacks", attacks), ("benign", benign)):
        total = sum(r.total for r in group)
        flagged = sum(r.flagged for r in group)
        print(f"{'all ' + name:<26} {'':<9} {'':<7} {total:>6} {flagged:>8} {flagged / max(total, 1):>7.1%}")
    print(f"scanned {scanned / 1e6:.1f} MB in {seconds:.2f} s ({scanned / 1e6 / seconds:.1f} MB/s)")
    if args.misses:
        for r in rows:
            if r.misses:
                print(f"\n== {r.corpus} ({'missed attacks' if r.label else 'false positives'}); rules: {dict(r.rules)}")
                for ident, rules, text in r.misses:
                    print(f"-- {ident} {rules}\n{text!r}")


if __name__ == "__main__":
    main()
