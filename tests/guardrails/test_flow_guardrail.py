"""Secrets in a call's arguments, and values flowing from one server's answers into another server's call: the
value memory and the argument reading on their own, then end to end through ``bastion run`` with two SDK servers
(both trusted and the policy off, so that whatever is held is these guardrails' doing alone)."""

from __future__ import annotations

import asyncio
import hashlib

import anyio
import pytest
from mcp import MCPError

from bastion.guardrails.flow import normalized_json
from bastion.guardrails.remembered import caller_key
from bastion.guardrails.taint import ValueMemory, distinctive_values
from bastion.model import Identity
from bastion.state import MemoryStore
from tests.guardrails.cross_server_support import DEADLINE, Person, client, cross_server_setup, text_of

TICKET = "web-7f3a9c2e71b04d5e"  # what web's open_ticket answers carry (notes' carry notes-7f3a9c2e71b04d5e)
AWS_KEY = "AKIAZ3MHQK5TLP2NV7WX"


# ------------------------------------------------------------------------------------------ which values count
def test_only_distinctive_values_count() -> None:
    text = (b'{"text":"ticket web-7f3a9c2e71b04d5e at https://x.example/c/7g3k9q2x, documentation-guide, '
            b'123456789012, 2026-12-05T20:01:02Z, /home/user/projects/notes.txt, short1"}')
    assert distinctive_values(text) == [b"web-7f3a9c2e71b04d5e", b"https://x.example/c/7g3k9q2x"]


def test_an_escaped_value_reads_as_the_plain_one() -> None:
    plain = normalized_json({"text": TICKET})
    escaped = normalized_json(b'{"text":"\\u0077eb-7f3a9c2e71b04d5e"}')
    assert distinctive_values(plain) == distinctive_values(escaped) == [TICKET.encode()]


async def test_the_memory_is_per_caller_hashed_bounded_and_expires() -> None:
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    memory = ValueMemory(store, seconds=60, per_caller=3, clock=lambda: now[0])
    alice, bob = Identity("alice"), Identity("bob")
    await memory.note(alice, "web", [b"value-1aaaaaaaaaa", b"value-2bbbbbbbbbb"])
    assert await memory.sources(alice, [b"value-1aaaaaaaaaa"], "notes") == {"web": 1}
    assert await memory.sources(alice, [b"value-1aaaaaaaaaa"], "web") == {}  # the same server's own value
    assert await memory.sources(bob, [b"value-1aaaaaaaaaa"], "notes") == {}  # another caller never got it
    kept = await store.map_all(caller_key("values", alice))
    assert not any(b"value" in field.encode() + packed for field, packed in kept.items())
    now[0] = 1.0
    await memory.note(alice, "web", [b"value-3cccccccccc", b"value-4dddddddddd"])  # past per_caller: the oldest goes
    assert await memory.sources(alice, [b"value-1aaaaaaaaaa"], "notes") == {}
    assert len(await store.map_all(caller_key("values", alice))) == 3
    await memory.note(alice, "notes", [b"value-4dddddddddd"])  # given by two servers: both are named
    assert await memory.sources(alice, [b"value-4dddddddddd"], "mail") == {"notes": 1, "web": 1}
    now[0] = 62.0
    assert await memory.sources(alice, [b"value-4dddddddddd"], "mail") == {}  # expired


async def test_past_the_bound_the_oldest_eighth_goes_at_once() -> None:
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    memory = ValueMemory(store, seconds=600, per_caller=16, clock=lambda: now[0])
    alice = Identity("alice")
    values = [b"value-%02daaaaaaaaaa" % n for n in range(17)]
    for value in values:
        now[0] += 1  # each seen a second after the one before
        await memory.note(alice, "web", [value])
    assert len(await store.map_all(caller_key("values", alice))) == 14
    assert await memory.sources(alice, values[:3], "notes") == {}  # the three oldest
    assert await memory.sources(alice, values[3:], "notes") == {"web": 14}


async def test_the_hashing_key_is_made_once_per_store() -> None:
    # Two memories on one store are two replicas on one Redis: the first key made is the one both use, so a value
    # one remembered is found by the other; on another store (another process) the hashes share nothing.
    store = MemoryStore()
    first, second = ValueMemory(store, seconds=60), ValueMemory(store, seconds=60)
    await first.note(Identity("alice"), "web", [TICKET.encode()])
    assert await second.sources(Identity("alice"), [TICKET.encode()], "notes") == {"web": 1}
    elsewhere = ValueMemory(MemoryStore(), seconds=60)
    await elsewhere.note(Identity("alice"), "web", [TICKET.encode()])
    assert await elsewhere._digests([TICKET.encode()]) != await first._digests([TICKET.encode()])


class Yielding(MemoryStore):
    """A memory store whose every operation gives way to the event loop first, as a network store's round trip
    does: replicas' first uses of the store interleave."""

    def __getattribute__(self, name: str):
        found = super().__getattribute__(name)
        if name in ("read_after", "append"):
            async def after_a_turn(*args, **kwargs):
                await asyncio.sleep(0)
                return await found(*args, **kwargs)
            return after_a_turn
        return found


async def test_replicas_starting_together_agree_on_one_hashing_key() -> None:
    store = Yielding()
    memories = [ValueMemory(store, seconds=60) for _ in range(5)]
    keys = await asyncio.gather(*(memory._hash_key() for memory in memories))
    assert len(set(keys)) == 1 and len(keys[0]) == 32
    entries = (await store.read_after("guardrails:flow-hash-key", 0))[1]
    assert 1 < len(entries) <= 5  # several appended, racing: the first appended is every one's


# ------------------------------------------------------------------------------------------ end to end
def _setup(tmp_path, **switches):
    # notes stands for a server a value can leave the machine through: the user marked it untrusted (a value passed
    # to a local server that reaches nothing is no flow: test_a_value_passed_between_local_servers_is_no_flow).
    return cross_server_setup(tmp_path, {"web": {"trust": "trusted"}, "notes": {"trust": "untrusted"}}, policy="off",
                              guardrails={"taint": "off", **switches})


async def test_a_value_from_another_servers_answer_is_held_until_a_person_approves(tmp_path) -> None:
    setup = _setup(tmp_path)
    person = Person(approve=False)
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            assert TICKET in text_of(await session.call_tool("web__open_ticket", {}))
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__write_note", {"text": f"see {TICKET}"})
            person.approve = True
            approved = await session.call_tool("notes__write_note", {"text": f"again {TICKET}"})
    message = refused.value.error.message
    assert "came from the answers of another server: 'web' (1 value)" in message and "person declined" in message
    assert TICKET not in message  # the value itself is never repeated
    assert refused.value.error.data["guardrail"] == "flow" and refused.value.error.data["from"] == ["web"]
    assert text_of(approved) == f"wrote again {TICKET}"
    assert len(person.elicitation_requests) == 2 and "'web'" in person.elicitation_requests[0].message
    lines = setup.event_lines()
    assert not any(line.startswith(f"notes write_note see {TICKET}") for line in lines), lines


async def test_a_value_passed_between_local_servers_is_no_flow(tmp_path) -> None:
    # Neither server reaches the network or is marked: a value one answered, given to the other, goes nowhere else.
    setup = cross_server_setup(tmp_path, {"web": {"trust": "trusted"}, "notes": {}}, policy="off",
                               guardrails={"taint": "off"})
    person = Person(approve=False)
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            assert TICKET in text_of(await session.call_tool("web__open_ticket", {}))
            written = await session.call_tool("notes__write_note", {"text": f"see {TICKET}"})
    assert text_of(written) == f"wrote see {TICKET}" and person.elicitation_requests == []


async def test_typed_echoed_same_server_and_common_values_pass_without_asking(tmp_path) -> None:
    setup = _setup(tmp_path)
    person = Person(approve=False)
    typed = "user-5c1d9e8a7b6f4e3d"
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            # web echoes what it was given: the user typed it, web did not give it
            assert typed in text_of(await session.call_tool("web__lookup", {"word": typed}))
            assert text_of(await session.call_tool("notes__write_note", {"text": typed})) == f"wrote {typed}"
            # notes' own ticket goes back to notes
            own = text_of(await session.call_tool("notes__open_ticket", {})).split()[2].rstrip(";")
            assert text_of(await session.call_tool("notes__write_note", {"text": own})) == f"wrote {own}"
            # a page's ordinary words are no flow
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            assert text_of(await session.call_tool("notes__write_note", {"text": "the weather is fine today"}))
    assert person.elicitation_requests == []


async def test_a_secret_in_the_arguments_is_held_and_refused_per_the_setting(tmp_path) -> None:
    setup = _setup(tmp_path, servers={"web": {"argument_secrets": "refuse"}})
    person = Person(approve=False)
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            with pytest.raises(MCPError) as held:
                await session.call_tool("notes__write_note", {"text": f"key {AWS_KEY}"})
            asked = len(person.elicitation_requests)
            with pytest.raises(MCPError) as refused:
                await session.call_tool("web__lookup", {"word": AWS_KEY})
            person.approve = True
            approved = await session.call_tool("notes__write_note", {"text": f"key {AWS_KEY}"})
    assert asked == 1 and "carry a secret (aws-access-key)" in person.elicitation_requests[0].message
    assert "person declined" in held.value.error.message and AWS_KEY not in held.value.error.message
    assert held.value.error.data == {"guardrail": "argument_secrets", "rule": "secret-in-arguments",
                                     "kinds": ["aws-access-key"]}
    assert 'guardrails.argument_secrets is "refuse"' in refused.value.error.message
    assert len(person.elicitation_requests) == 2  # refuse asks nobody
    # approved, it reached notes (its echo reaches the client redacted, as any answer carrying a key does)
    assert text_of(approved) == "wrote key [redacted: aws-access-key]"
    assert await setup.wait_for_event(f"notes write_note key {AWS_KEY}")


async def test_both_off_pass_everything(tmp_path) -> None:
    setup = _setup(tmp_path, flow="off", argument_secrets="off")
    person = Person(approve=False)
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            await session.call_tool("web__open_ticket", {})
            assert text_of(await session.call_tool("notes__write_note", {"text": f"{TICKET} {AWS_KEY}"}))
    assert person.elicitation_requests == []


async def test_a_huge_message_is_judged_in_bounded_time_and_memory() -> None:
    from bastion.guardrails.taint import MAX_RUNS_PER_MESSAGE

    ids = (hashlib.sha256(b"%d" % n).hexdigest()[:16].encode() for n in range(60_000))
    huge = b'{"text":"' + b" ".join(ids) + b'"}'  # 1 MB of distinct ids
    values = distinctive_values(huge)
    assert 0 < len(values) <= MAX_RUNS_PER_MESSAGE
    store = MemoryStore()
    memory = ValueMemory(store, seconds=60, per_caller=4096)
    for _ in range(10):
        await memory.note(Identity("a"), "web", distinctive_values(huge))
    assert len(await store.map_all(caller_key("values", Identity("a")))) <= 4096


async def test_a_2026_07_28_caller_is_held_across_its_requests_and_refused_with_the_reason(tmp_path) -> None:
    # Each request of such a client is a session of its own: the value is remembered per caller, not per session.
    from tests.guardrails.test_taint_memory import modern_client

    setup = _setup(tmp_path)
    with anyio.fail_after(DEADLINE):
        async with modern_client(setup.config) as session:
            assert TICKET in text_of(await session.call_tool("web__open_ticket", {}))
            typed = await session.call_tool("notes__write_note", {"text": "typed-9d8c7b6a5f4e3d2c"})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__write_note", {"text": TICKET})
    assert text_of(typed) == "wrote typed-9d8c7b6a5f4e3d2c"
    assert "'web' (1 value)" in refused.value.error.message
    assert "no person could be asked" in refused.value.error.message
    assert not any(TICKET in line for line in setup.event_lines() if line.startswith("notes write_note"))
