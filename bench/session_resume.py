"""The two ways a handshake-era session can continue on another replica (issue 31), measured side by side:

- the shared record (what Bastion does, bastion/frontends/http/records.py): the session id is 32 random
  characters; a replica handed one it does not know reads the sealed record from the store and opens it (one store
  round trip and one AES-GCM open), then serves from its own copy; a session in use is refreshed in the store at
  most every few seconds;
- a sealed token: the session's state (the same record) sealed with AES-GCM into the session id itself; a replica
  opens the id it is handed (no store), then keeps a copy by id as well; nothing to refresh, but nothing to delete
  either (a token is good until its expiry), and a change of state (initialized, the log level) would need a new
  id, which Streamable HTTP cannot hand to a client mid-session.

Measured: the cost of the first request a replica sees of a session (the resume: what differs between the two) and
of every later request (the copy by id, the same for both, plus the record's refresh amortized), and the id's
length. The resume is timed on the in-memory store and, when ``--redis`` is given and redis-server is installed,
on a real Redis on loopback (tests/redis_server.py) with the RedisStore.

Usage: .venv/bin/python bench/session_resume.py [--sessions N] [--redis] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bastion.frontends.http.quotas import Holder  # noqa: E402
from bastion.frontends.http.records import KeyRing, SessionRecord, SessionRecords  # noqa: E402
from bastion.state import MemoryStore  # noqa: E402

# What an SDK client sends at initialize, roughly: its capabilities and info are most of a record.
RECORD = SessionRecord(
    ["alice@example.com", ["engineering"], "oauth", "https://id.example.com"],
    Holder(("identity", "oauth", "https://id.example.com", "alice@example.com"), "alice@example.com (oauth)",
           "http.max_sessions_per_identity", 100),
    "2025-11-25", {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {"form": {}, "url": {}}},
    {"name": "claude-code", "version": "2.1.3", "title": "Claude Code"}, True, "info")


class Tokens:
    """The sealed-token design: the record sealed into the id (base64url), opened by any replica."""

    def __init__(self, keys: KeyRing, idle_timeout: float) -> None:
        self.keys, self.idle_timeout = keys, idle_timeout

    def make(self, record: SessionRecord) -> str:
        sealed = self.keys.seal(record.encode(), b"token", time.time() + self.idle_timeout)
        return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    def open(self, token: str) -> SessionRecord | None:
        try:
            sealed = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except ValueError:
            return None
        plain = self.keys.open(sealed, b"token", time.time())
        return SessionRecord.decode(plain) if plain is not None else None


def per_request(ids: list[str], repeat: int) -> float:
    """A request on a session this replica has a copy of: the look-up by id (either design)."""
    copies = {session_id: RECORD for session_id in ids}
    start = time.perf_counter()
    for _ in range(repeat):
        for session_id in ids:
            copies.get(session_id)
    return (time.perf_counter() - start) / (repeat * len(ids))


async def resume_by_record(store: Any, count: int) -> tuple[float, float, int]:
    records = SessionRecords(store, KeyRing([secrets.token_bytes(32)]), 3600)
    ids = [secrets.token_urlsafe(24) for _ in range(count)]
    for session_id in ids:
        await records.save(session_id, RECORD)
    times = []
    for session_id in ids:
        start = time.perf_counter()
        record = await records.load(session_id)
        times.append(time.perf_counter() - start)
        assert record == RECORD
    # A refresh (exists + put) every refresh_seconds of a session in use: its cost, spread over the requests of
    # a client making one a second.
    start = time.perf_counter()
    for session_id in ids:
        if await records.exists(session_id):
            await records.save(session_id, RECORD)
    refresh = (time.perf_counter() - start) / count
    return statistics.median(times), refresh / records.refresh_seconds, len(ids[0])


def resume_by_token(count: int) -> tuple[float, int]:
    tokens = Tokens(KeyRing([secrets.token_bytes(32)]), 3600)
    made = [tokens.make(RECORD) for _ in range(count)]
    times = []
    for token in made:
        start = time.perf_counter()
        record = tokens.open(token)
        times.append(time.perf_counter() - start)
        assert record == RECORD
    return statistics.median(times), len(made[0])


async def redis_store() -> tuple[Any, Any] | None:
    from bastion.state.redis_store import RedisStore
    from tests.redis_server import RedisServer, redis_available

    if not redis_available():
        return None
    server = RedisServer().start()
    return RedisStore(server.url), server


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--redis", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    memory = MemoryStore()
    resume, refresh, id_length = await resume_by_record(memory, args.sessions)
    figures["record"] = {"resume_us_memory": resume * 1e6, "refresh_us_per_request_memory": refresh * 1e6,
                         "id_length": id_length}
    if args.redis:
        made = await redis_store()
        if made is None:
            figures["record"]["redis"] = "redis-server is not installed"
        else:
            store, server = made
            try:
                resume, refresh, _ = await resume_by_record(store, args.sessions)
                figures["record"].update(resume_us_redis=resume * 1e6, refresh_us_per_request_redis=refresh * 1e6)
            finally:
                await store.aclose()
                server.close()
    token_resume, token_length = resume_by_token(args.sessions)
    figures["token"] = {"resume_us": token_resume * 1e6, "id_length": token_length}
    figures["per_request_us"] = per_request([secrets.token_urlsafe(24) for _ in range(1000)], 200) * 1e6
    figures["record_bytes"] = len(RECORD.encode())
    if args.json:
        print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
        return
    record = figures["record"]
    print(f"record bytes (sealed: + 4 key id + 12 nonce + 8 expiry + 16 tag): {figures['record_bytes']}")
    print(f"shared record: id {record['id_length']} chars; resume {record['resume_us_memory']:.1f} µs (memory store)"
          + (f", {record['resume_us_redis']:.1f} µs (Redis on loopback)" if "resume_us_redis" in record else "")
          + f"; refresh {record['refresh_us_per_request_memory']:.3f} µs per request at one request a second"
          + (f" ({record['refresh_us_per_request_redis']:.1f} µs on Redis)" if "resume_us_redis" in record else ""))
    print(f"sealed token: id {figures['token']['id_length']} chars; resume {figures['token']['resume_us']:.1f} µs")
    print(f"a later request (the copy by id, either design): {figures['per_request_us']:.3f} µs")


if __name__ == "__main__":
    asyncio.run(main())
