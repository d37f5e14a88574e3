"""The contract of ``StateStore`` (bastion/state/store.py), the same tests on every implementation (the ``store``
fixture of tests/state/conftest.py): what one operation promises, including under concurrent callers. Expiries are
shown with short real times and waited out on the store's own answers, never by a sleep the test guesses."""

from __future__ import annotations

import asyncio

import pytest

from bastion.state import Bucket


async def _until_gone(store, check) -> None:
    """Wait for an expiry by asking the store, yielding to the loop between looks (the store's clock decides)."""
    for _ in range(100_000):
        if not await check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the entry never expired")


async def test_a_key_is_claimed_once_until_it_expires(store) -> None:
    assert not await store.recorded("k")
    assert await store.claim("k", 0.3)
    assert await store.recorded("k")
    assert not await store.claim("k", 0.3)
    await _until_gone(store, lambda: store.recorded("k"))
    assert await store.claim("k", 60)


async def test_of_concurrent_claims_of_one_key_exactly_one_wins(store) -> None:
    won = await asyncio.gather(*(store.claim("race", 60) for _ in range(50)))
    assert won.count(True) == 1


async def test_values_are_put_read_replaced_and_deleted(store) -> None:
    assert await store.get("v") is None
    await store.put("v", b"one")
    assert await store.get("v") == b"one"
    await store.put("v", b"\x00two\xff")
    assert await store.get("v") == b"\x00two\xff"
    assert await store.delete("v")
    assert not await store.delete("v")
    assert await store.get("v") is None


async def test_a_value_with_seconds_expires(store) -> None:
    await store.put("brief", b"x", 0.3)
    assert await store.get("brief") == b"x"
    await _until_gone(store, lambda: store.recorded("brief"))
    assert await store.get("brief") is None


async def test_maps_set_fields_read_them_and_drop_them(store) -> None:
    assert await store.map_all("m") == {}
    await store.map_put("m", {"a": b"1", "b": b"2"})
    await store.map_put("m", {"b": b"3"})
    assert await store.map_get("m", "b") == b"3"
    assert await store.map_get("m", "zz") is None
    assert await store.map_all("m") == {"a": b"1", "b": b"3"}
    await store.map_delete("m", ["a"])
    assert await store.map_all("m") == {"b": b"3"}
    await store.map_delete("m", ["b"])
    assert not await store.recorded("m")


async def test_a_map_with_seconds_expires_whole(store) -> None:
    await store.map_put("tm", {"a": b"1"}, 0.3)
    assert await store.map_all("tm") == {"a": b"1"}
    await _until_gone(store, lambda: store.recorded("tm"))
    assert await store.map_all("tm") == {}


async def test_a_counter_stops_at_its_limit_and_is_forgotten_at_zero(store) -> None:
    assert await store.add("c", 1, limit=2) == 1
    assert await store.add("c", 1, limit=2) == 2
    assert await store.add("c", 1, limit=2) is None  # refused, and nothing counted
    assert await store.add("c", -1) == 1
    assert await store.add("c", 1, limit=2) == 2
    assert await store.add("c", -2) == 0
    assert not await store.recorded("c")


async def test_concurrent_adds_never_pass_the_limit(store) -> None:
    results = await asyncio.gather(*(store.add("q", 1, limit=7) for _ in range(40)))
    assert sum(1 for r in results if r is not None) == 7
    assert sorted(r for r in results if r is not None) == list(range(1, 8))


async def test_buckets_give_a_burst_then_refuse_with_the_wait_and_take_from_none(store) -> None:
    slow = Bucket("b:slow", rate=0.5, burst=2)
    # Slow to refill, so that the round trips below (on a networked store) refill nothing of it.
    wide = Bucket("b:wide", rate=0.01, burst=100)
    assert (await store.take([wide, slow])).granted
    assert (await store.take([wide, slow])).granted
    refused = await store.take([wide, slow])
    assert not refused.granted and refused.refused == 1
    assert 0 < refused.wait <= 2.0 + 0.01  # a token every 2 s
    # The refused call took nothing from the bucket that had tokens: 98 left, not 97.
    for _ in range(98):
        assert (await store.take([wide])).granted
    assert not (await store.take([wide])).granted


async def test_a_bucket_refills_at_its_rate(store) -> None:
    quick = Bucket("b:quick", rate=20, burst=1)
    assert (await store.take([quick])).granted
    refused = await store.take([quick])
    assert not refused.granted and refused.wait <= 0.05 + 0.01
    await _until_gone(store, lambda: _refused(store, quick))


async def _refused(store, bucket) -> bool:
    return not (await store.take([bucket])).granted


async def test_concurrent_takes_never_give_more_than_the_burst(store) -> None:
    bucket = Bucket("b:crowd", rate=0.001, burst=5)
    results = await asyncio.gather(*(store.take([bucket]) for _ in range(30)))
    assert sum(1 for taken in results if taken.granted) == 5


async def test_a_sliding_window_counts_to_its_limit(store) -> None:
    assert await store.hit("w", 2, 0.4) == 0
    assert await store.hit("w", 2, 0.4) == 0
    wait = await store.hit("w", 2, 0.4)
    assert 0 < wait <= 0.4 + 0.01
    # Once the oldest leaves the window, a hit is counted again (the look that finds room is that hit; the second
    # hit may still be in the window then, so nothing is said of a hit after it).
    await _until_gone(store, lambda: _window_full(store))


async def _window_full(store) -> bool:
    return await store.hit("w", 2, 0.4) > 0


async def test_a_log_numbers_entries_keeps_the_last_and_reads_after_a_number(store) -> None:
    numbers = [await store.append("log", f"e{n}".encode(), keep=3, seconds=60) for n in range(1, 6)]
    assert numbers == [1, 2, 3, 4, 5]
    oldest, entries = await store.read_after("log", 0)
    assert oldest == 3 and entries == [(3, b"e3"), (4, b"e4"), (5, b"e5")]
    assert await store.read_after("log", 4) == (3, [(5, b"e5")])
    assert await store.read_after("log", 5) == (3, [])
    assert await store.read_after("nothing", 0) == (0, [])


async def test_messages_reach_every_subscriber_in_order(store) -> None:
    first = await store.subscribe("chan")
    second = await store.subscribe("chan")
    received = await store.publish("chan", b"one")
    await store.publish("chan", b"two")
    assert received >= 1  # Redis counts a process's one pub/sub connection, not its subscribers
    for subscription in (first, second):
        messages = []
        async for message in subscription:
            messages.append(message)
            if len(messages) == 2:
                break
        assert messages == [b"one", b"two"]
    await first.aclose()
    assert await store.publish("chan", b"three") == 1
    await second.aclose()
    assert await store.publish("chan", b"four") == 0


async def test_ping_answers(store) -> None:
    await store.ping()


@pytest.mark.parametrize("key", ["with space", "ünïcode", "a:b:c", "x" * 300])
async def test_any_string_is_a_key(store, key) -> None:
    await store.put(key, b"v")
    assert await store.get(key) == b"v"
