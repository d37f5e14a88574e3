"""What only the Redis store has to show, on a real ``redis-server`` (tests/redis_server.py): a Redis that is gone,
restarted or slow; the bound on its connections; a password; TLS; keys that look like patterns. The contract every
store keeps is tests/state/test_store_contract.py."""

from __future__ import annotations

import asyncio
import secrets
import signal
from pathlib import Path

import pytest
import trustme
from redis.asyncio import Redis

from bastion.state import Bucket, StateUnavailable
from bastion.state.redis_store import RedisStore
from tests.redis_server import RedisServer, free_port, redis_available

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")

PASSWORD = "s3cret-" + secrets.token_hex(8)


def _store(server: RedisServer, **options) -> RedisStore:
    return RedisStore(f"redis://127.0.0.1:{server.port}/0", key_prefix=f"t{secrets.token_hex(4)}:", **options)


async def _eventually(check, what: str):
    """Ask until ``check`` answers something true (a reconnect in the background has happened), yielding to the
    loop between looks; the answer is the store's, not a guessed delay."""
    for _ in range(2000):
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def _bastion_clients(server: RedisServer, password: str | None = None) -> int:
    """Connections Redis has from stores (they name themselves "bastion"), as Redis itself counts them."""
    admin = Redis(host="127.0.0.1", port=server.port, password=password)
    try:
        clients = await admin.client_list()
    finally:
        await admin.aclose()
    return sum(1 for client in clients if client.get("name") == "bastion")


async def test_an_unreachable_redis_is_said_quickly_naming_the_store_and_never_the_password() -> None:
    port = free_port()  # nothing listens there
    store = RedisStore(f"redis://127.0.0.1:{port}/3", password=PASSWORD, timeout=0.5)
    try:
        for operation in (store.ping, lambda: store.claim("k", 5), lambda: store.take([Bucket("b", 1, 1)]),
                          lambda: store.get("k"), lambda: store.subscribe("c")):
            with pytest.raises(StateUnavailable) as failed:
                await operation()
            message = str(failed.value)
            assert f"127.0.0.1:{port}/3" in message and "cannot be reached" in message
            assert PASSWORD not in message
    finally:
        await store.aclose()


async def test_a_restarted_redis_serves_the_next_operation_and_subscriptions_come_back() -> None:
    server = RedisServer().start()
    store = _store(server)
    try:
        await store.put("before", b"1")
        listening = await store.subscribe("news")
        server.stop()
        with pytest.raises(StateUnavailable):
            await store.put("during", b"1")
        with pytest.raises(StateUnavailable):
            await store.publish("news", b"lost")
        server.start()
        # The first operation after the restart works: no retry by the caller, no restart of the store.
        await store.put("after", b"2")
        assert await store.get("after") == b"2"
        # The subscription subscribed again by itself: a message published now reaches it.
        await _eventually(lambda: store.publish("news", b"back"), "the subscription came back")
        async for message in listening:
            assert message == b"back"
            break
        await listening.aclose()
    finally:
        await store.aclose()
        server.close()


async def test_connections_stay_bounded_under_load_and_across_restarts() -> None:
    server = RedisServer().start()
    store = _store(server, max_connections=4)
    try:
        subscription = await store.subscribe("c")
        for _ in range(3):
            results = await asyncio.gather(*(store.add(f"n{i % 7}", 1) for i in range(300)))
            assert len(results) == 300
            await asyncio.gather(*(store.take([]) for _ in range(10)), *(store.recorded("x") for _ in range(50)))
            # The pool's 4, one of them the pub/sub connection; never one per operation.
            assert await _bastion_clients(server) <= 4
            server.stop()
            with pytest.raises(StateUnavailable):
                await store.get("x")
            server.start()
        assert sum(await asyncio.gather(*(store.add("after", 1) for _ in range(100)))) == sum(range(1, 101))
        await _eventually(lambda: store.publish("c", b"m"), "the subscription came back")
        assert await _bastion_clients(server) <= 4
        await subscription.aclose()
    finally:
        await store.aclose()
        server.close()


async def test_a_password_is_needed_and_used() -> None:
    server = RedisServer(password=PASSWORD).start()
    without = _store(server, timeout=1)
    wrong = _store(server, password="not-it", timeout=1)
    right = _store(server, password=PASSWORD)
    try:
        for store in (without, wrong):
            with pytest.raises(StateUnavailable) as failed:
                await store.put("k", b"v")
            assert PASSWORD not in str(failed.value) and "not-it" not in str(failed.value)
            assert "auth" in str(failed.value).lower() or "password" in str(failed.value).lower()
        await right.put("k", b"v")
        assert await right.get("k") == b"v"
    finally:
        for store in (without, wrong, right):
            await store.aclose()
        server.close()


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    authority = trustme.CA()
    server_cert = authority.issue_cert("127.0.0.1", "localhost")
    client_cert = authority.issue_cert("bastion-client")
    files = {"ca": tmp_path / "ca.pem", "server": tmp_path / "server.pem", "server_key": tmp_path / "server.key",
             "client": tmp_path / "client.pem", "client_key": tmp_path / "client.key"}
    authority.cert_pem.write_to_path(str(files["ca"]))
    server_cert.private_key_pem.write_to_path(str(files["server_key"]))
    server_cert.cert_chain_pems[0].write_to_path(str(files["server"]))
    client_cert.private_key_pem.write_to_path(str(files["client_key"]))
    client_cert.cert_chain_pems[0].write_to_path(str(files["client"]))
    return {name: str(path) for name, path in files.items()}


async def test_tls_with_the_ca_and_a_client_certificate(tls_files: dict[str, str]) -> None:
    port = free_port()
    server = RedisServer().start("--port", "0", "--tls-port", str(port), "--tls-cert-file", tls_files["server"],
                                 "--tls-key-file", tls_files["server_key"], "--tls-ca-cert-file", tls_files["ca"],
                                 "--tls-auth-clients", "yes")
    url = f"rediss://127.0.0.1:{port}/0"
    trusted = RedisStore(url, tls_ca_file=tls_files["ca"], tls_cert_file=tls_files["client"],
                         tls_key_file=tls_files["client_key"])
    unknown_ca = RedisStore(url, timeout=1)  # the system's CAs do not know this one
    no_client_cert = RedisStore(url, tls_ca_file=tls_files["ca"], timeout=1)
    plain = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=1)
    try:
        await trusted.put("k", b"over tls")
        assert await trusted.get("k") == b"over tls"
        subscription = await trusted.subscribe("c")
        assert await trusted.publish("c", b"m") == 1
        await subscription.aclose()
        for store in (unknown_ca, no_client_cert, plain):
            with pytest.raises(StateUnavailable) as failed:
                await store.get("k")
            assert f"127.0.0.1:{port}/0" in str(failed.value)
    finally:
        for store in (trusted, unknown_ca, no_client_cert, plain):
            await store.aclose()
        server.close()


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


async def test_keys_that_look_like_patterns_are_only_themselves(redis_server) -> None:
    store, other = _store(redis_server), _store(redis_server)
    try:
        odd = ["*", "a*", "a?", "[ab]", "a:b", "a:*", "\\", "line\nbreak", "", "ünï", "\udcff"]
        for index, key in enumerate(odd):
            await store.put(key, str(index).encode())
        await store.put("ab", b"plain")
        for index, key in enumerate(odd):
            assert await store.get(key) == str(index).encode()
        assert await store.delete("*") and await store.delete("a*")
        assert await store.get("ab") == b"plain" and await store.get("a?") == str(odd.index("a?")).encode()
        await store.map_put("m", {"*": b"1", "f:*": b"2"})
        assert await store.map_all("m") == {"*": b"1", "f:*": b"2"}
        # Another prefix is another namespace: nothing of one store is seen by the other.
        assert await other.get("ab") is None and await other.map_all("m") == {}
        assert not await other.recorded("a:b")
    finally:
        await store.aclose()
        await other.aclose()


async def test_buckets_follow_redis_clock_so_two_stores_share_them(redis_server) -> None:
    """Two stores (two replicas) on one Redis, one bucket: the burst is shared, whichever takes the tokens."""
    prefix = f"shared{secrets.token_hex(4)}:"
    first = RedisStore(f"redis://127.0.0.1:{redis_server.port}/0", key_prefix=prefix)
    second = RedisStore(f"redis://127.0.0.1:{redis_server.port}/0", key_prefix=prefix)
    bucket = Bucket("b", rate=0.001, burst=6)
    try:
        taken = await asyncio.gather(*((first if n % 2 else second).take([bucket]) for n in range(20)))
        assert sum(1 for t in taken if t.granted) == 6
        refused = [t for t in taken if not t.granted]
        assert all(t.refused == 0 and t.wait > 100 for t in refused)
    finally:
        await first.aclose()
        await second.aclose()


async def test_extreme_limits_are_taken_as_given(redis_server) -> None:
    store = _store(redis_server)
    try:
        # Expiries of centuries and waits of years: written as whole milliseconds, never as 1e+15.
        huge = Bucket("huge", rate=1e-9, burst=1e9)
        assert (await store.take([huge])).granted
        tiny = Bucket("tiny", rate=1e-9, burst=1)
        assert (await store.take([tiny])).granted
        refused = await store.take([tiny])
        assert not refused.granted and refused.wait > 1e8
        assert await store.hit("long", 1, 1e10) == 0 and await store.hit("long", 1, 1e10) > 1e9
        assert await store.add("big", 10**15) == 10**15
    finally:
        await store.aclose()


async def test_a_hung_redis_times_out_and_the_next_operation_after_it_answers_again_works() -> None:
    server = RedisServer().start()
    store = _store(server, timeout=0.5)
    try:
        await store.put("k", b"v")
        server.process.send_signal(signal.SIGSTOP)  # alive, listening, answering nothing
        try:
            with pytest.raises(StateUnavailable) as failed:
                await store.get("k")
            assert "no answer in time" in str(failed.value) or "Timeout" in str(failed.value)
        finally:
            server.process.send_signal(signal.SIGCONT)
        # The answer that came late is not taken for the next operation's: its connection was dropped.
        await store.put("k2", b"v2")
        assert await store.get("k") == b"v" and await store.get("k2") == b"v2"
    finally:
        await store.aclose()
        server.close()


async def test_a_long_outage_does_not_use_the_pool_up() -> None:
    """Attempts to subscribe while Redis is away, and the subscription's own attempts to come back, each give their
    connection back: with a pool of 2, everything works once Redis is back."""
    server = RedisServer().start()
    store = _store(server, max_connections=2, timeout=0.5)
    try:
        listening = await store.subscribe("kept")
        server.stop()
        for attempt in range(6):
            with pytest.raises(StateUnavailable):
                await store.subscribe(f"new{attempt}")
            with pytest.raises(StateUnavailable):
                await store.put("k", b"v")
        server.start()
        await store.put("k", b"v")
        fresh = await store.subscribe("fresh")
        assert await store.publish("fresh", b"1") == 1
        await _eventually(lambda: store.publish("kept", b"back"), "the first subscription came back")
        await fresh.aclose()
        await listening.aclose()
    finally:
        await store.aclose()
        server.close()


async def test_an_error_answer_is_told_apart_from_an_unreachable_redis(redis_server) -> None:
    store = _store(redis_server)
    try:
        await store.put("a value", b"v")
        with pytest.raises(StateUnavailable) as failed:
            await store.map_put("a value", {"f": b"1"})  # a key of another type: Redis answers WRONGTYPE
        assert "answered with an error" in str(failed.value) and "WRONGTYPE" in str(failed.value)
    finally:
        await store.aclose()
