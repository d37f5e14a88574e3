"""How long the web console's audit page takes to verify and search a large trail, in the process that does it
(``bastion.console.audit_worker``, apart from the gateway) and in this one: a trail of 100,000 call records (about
47 MB) written by the real sealer once, then read. ``python bench/console_audit_read.py [FOLDER]``."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bastion.console.audit_view import AuditQuery, search, verify_trail
from bastion.console.audit_worker import read
from bastion.policy.audit import AuditWriter

CALLS = 50_000  # each a decision record and a call record


def trail_in(folder: Path) -> Path:
    path = folder / "audit.jsonl"
    if not path.exists():
        writer = AuditWriter(path)
        who = {"name": "alice", "groups": ["dev"], "authenticated_by": "header", "session": "s1"}
        stages = [("authorization", "allow", "default-allow", "allowed", None)]
        for i in range(CALLS):
            writer.write_call((time.time(), who, "tools/call", "files__read", {"path": f"/a/{i}"}, True, "complete",
                               1_000_000, stages))
        writer.close()
    return path


def timed(what: str, run) -> None:
    started = time.perf_counter()
    run()
    print(f"{what}: {time.perf_counter() - started:.2f} s", file=sys.stderr)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="bastion-audit-bench-"))
    path = trail_in(folder)
    print(f"trail: {path} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    timed("verify in this process", lambda: verify_trail(path))
    timed("search in this process", lambda: search(path, AuditQuery(identity="bob")))
    timed("the audit page's read (worker process: verify and search)",
          lambda: asyncio.run(read(str(path), {"identity": "bob"})))
    empty = folder / "empty.jsonl"
    empty.write_text("")
    timed("the same on an empty trail (the worker's start)", lambda: asyncio.run(read(str(empty), {})))


if __name__ == "__main__":
    main()
