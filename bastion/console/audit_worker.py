"""Verifying and searching the audit trail in a process of its own, for the console's pages.

A trail of 50 MB takes seconds of CPU to verify (a hash per record, in Python) and most of a second to search. On a
worker thread of the gateway that time would hold the interpreter's lock the gateway's calls need; in a process of
its own it costs the gateway nothing but the wait of the page that asked. The process runs ``verify_trail`` (the code
of ``bastion audit verify``) and ``search``, and prints one JSON document that ``read`` turns back into their
results.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import asdict
from typing import Any, Mapping

import orjson

from bastion.console.audit_view import AuditQuery, ChainState, Found, QueryError, SearchResult, search, verify_trail
from bastion.console.interventions import tally

WORKER_SECONDS = 120.0  # a trail that takes longer than this to read is said to be too big for the page
MAX_OUTPUT = 64 * 1024 * 1024


class TrailUnreadable(Exception):
    """The worker could not read the trail in time, or failed; the message says what the page should say."""


def _key(key_file: str) -> bytes | None:
    if not key_file:
        return None
    with open(key_file) as held:
        return bytes.fromhex(held.read().strip())


def work(request: Mapping[str, Any]) -> dict[str, Any]:
    """Verify (when asked) and search the trail as ``request`` says; what ``read`` turns back into results."""
    trail = str(request["trail"])
    state = verify_trail(trail, _key(str(request.get("key_file") or ""))) if request.get("verify") else None
    try:
        query = AuditQuery.from_form(request.get("form") or {}, **({"kind": request["kind"]} if request.get("kind")
                                                                    else {}))
    except QueryError as error:
        return {"state": _state(state), "error": str(error)}
    count_by = tally if request.get("count") else None
    result = search(trail, query, state.broken_at if state is not None else frozenset(), count_by)
    return {"state": _state(state), "error": None, "scanned": result.scanned, "more": result.more,
            "found": [asdict(found) for found in result.found],
            "counts": [[*key, number] for key, number in result.counts.items()]}


def _state(state: ChainState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {"intact": state.intact, "records": state.records, "chains": state.chains, "problems": state.problems,
            "notes": state.notes, "broken_at": sorted(state.broken_at)}


def _read_state(data: dict[str, Any] | None) -> ChainState | None:
    if data is None:
        return None
    return ChainState(data["intact"], data["records"], data["chains"], tuple(data["problems"]), tuple(data["notes"]),
                      frozenset((file, line) for file, line in data["broken_at"]))


async def read(trail: str, form: Mapping[str, str], *, key_file: str | None = None, verify: bool = True,
               kind: str = "", count: bool = False) -> tuple[ChainState | None, SearchResult | None, str | None]:
    """(the chains' verification or None, the search's result or None, why the search fields cannot be read or
    None); raises TrailUnreadable when the worker fails or takes longer than ``WORKER_SECONDS``."""
    request = orjson.dumps({"trail": trail, "form": dict(form), "key_file": key_file or "", "verify": verify,
                            "kind": kind, "count": count})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "bastion.console.audit_worker", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=MAX_OUTPUT)
    try:
        out, err = await asyncio.wait_for(process.communicate(request), WORKER_SECONDS)
    except asyncio.TimeoutError:
        raise TrailUnreadable(f"the audit trail took more than {WORKER_SECONDS:.0f} s to read; search it with "
                              "bastion audit verify and a narrower time range") from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()
        raise TrailUnreadable(f"the audit trail could not be read ({said[-1] if said else process.returncode})")
    answer = orjson.loads(out)
    state = _read_state(answer["state"])
    if answer["error"] is not None:
        return state, None, answer["error"]
    result = SearchResult([Found(**found) for found in answer["found"]], answer["scanned"], answer["more"])
    for *key, number in answer["counts"]:
        result.counts[tuple(key)] = number
    return state, result, None


def main() -> int:
    sys.stdout.buffer.write(orjson.dumps(work(orjson.loads(sys.stdin.buffer.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
