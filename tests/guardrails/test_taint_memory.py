"""Taint for 2026-07-28 clients, whose every request is a session of its own: what one request read is kept per
caller (bounded, expiring) and holds the calls of the next ones. The memory's decisions with a clock the test
turns, then a real ``bastion run`` driven by the official SDK client in 2026-07-28 mode."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters

from bastion.guardrails.remembered import caller_key
from bastion.guardrails.taint import TaintMemory
from bastion.model import Identity, TaintSource
from bastion.state import MemoryStore
from tests.guardrails.cross_server_support import DEADLINE, cross_server_setup, text_of
from tests.support import BASTION

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

ALICE, BOB = Identity("alice"), Identity("bob")
WEB = TaintSource("web", "tools/call web__fetch_page", "untrusted server")
DOCS = TaintSource("docs", "resources/read docs://a", "untrusted server")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def memory(clock: Clock, seconds: float = 60) -> TaintMemory:
    # The store and the memory read one clock, as replicas read the store's for expiries.
    return TaintMemory(MemoryStore(clock=clock), seconds=seconds, clock=clock)


async def test_a_callers_taint_is_kept_for_its_next_requests_and_no_one_elses() -> None:
    kept = memory(Clock())
    assert await kept.recall(ALICE) == {}
    await kept.keep(ALICE, {"web": WEB}, renewed="web")
    assert await kept.recall(ALICE) == {"web": WEB}
    assert await kept.recall(BOB) == {}
    # The same caller by name, method and issuer is the same caller; another issuer's "alice" is not.
    assert await kept.recall(Identity("alice")) == {"web": WEB}
    assert await kept.recall(Identity("alice", authenticated_by="oauth", issuer="https://id.example")) == {}


async def test_the_first_content_of_each_server_is_what_is_kept() -> None:
    kept = memory(Clock())
    await kept.keep(ALICE, {"web": WEB}, renewed="web")
    later = TaintSource("web", "tools/call web__other", "untrusted server")
    recalled = await kept.recall_kept(ALICE)
    await kept.keep(ALICE, {"web": later, "docs": DOCS}, renewed="docs", recalled=recalled)
    assert list((await kept.recall(ALICE)).items()) == [("web", WEB), ("docs", DOCS)]  # in the order they came


async def test_taint_expires_after_the_last_answer_that_tainted() -> None:
    clock = Clock()
    kept = memory(clock)
    await kept.keep(ALICE, {"web": WEB}, renewed="web")
    clock.now += 50
    await kept.keep(ALICE, {"web": WEB}, renewed="web", recalled=await kept.recall_kept(ALICE))  # web again: 60 s
    clock.now += 50
    assert await kept.recall(ALICE) == {"web": WEB}
    await kept.keep(ALICE, {"web": WEB, "docs": DOCS}, renewed="docs",
                    recalled=await kept.recall_kept(ALICE))  # an answer of docs does not renew web
    clock.now += 11
    assert await kept.recall(ALICE) == {"docs": DOCS}
    clock.now += 60
    assert await kept.recall(ALICE) == {}


async def test_only_news_is_written() -> None:
    # Nearly every request of a tainted caller leaves what it recalled: no write for it (a round trip on Redis), and
    # a server answering again and again renews its time at most every renew_every (60 s / 60 here).
    clock = Clock()
    kept = memory(clock)
    assert await kept.keep(ALICE, {"web": WEB}, renewed="web")
    assert not await kept.keep(ALICE, {"web": WEB}, renewed=None, recalled=await kept.recall_kept(ALICE))
    assert not await kept.keep(ALICE, {"web": WEB}, renewed="notes", recalled=await kept.recall_kept(ALICE))
    clock.now += 0.5
    assert not await kept.keep(ALICE, {"web": WEB}, renewed="web", recalled=await kept.recall_kept(ALICE))
    clock.now += 0.6
    assert await kept.keep(ALICE, {"web": WEB}, renewed="web", recalled=await kept.recall_kept(ALICE))


@pytest.mark.parametrize("first, second", [
    (Identity("a:b", groups=("c",)), Identity("a", groups=("b:c",))),
    (Identity("a", groups=("b", "c")), Identity("a", groups=("b,c",))),
    (Identity("*"), Identity("alice")),
    (Identity("alice", authenticated_by="oauth", issuer="x"), Identity("alice", authenticated_by="oauth", issuer="x:")),
])
async def test_callers_whose_words_run_together_are_kept_apart(first, second) -> None:
    kept = memory(Clock())
    await kept.keep(first, {"web": WEB}, renewed="web")
    assert await kept.recall(second) == {}


async def test_what_the_store_holds_is_read_with_care() -> None:
    # A store holds what it is given: an entry no gateway wrote (another version, a hand in Redis) is not a source.
    store = MemoryStore()
    kept = TaintMemory(store, seconds=60)
    await store.map_put(caller_key("taint", ALICE), {
        "s:web": b"not json", "u:web": b"9e99",  # no source
        "s:docs": b'[1, "web", "t", "r"]', "u:docs": b"9e99",  # a source of another server than its field's
        "s:mail": b'[1, "mail", "t", "r"]', "u:mail": b"soon"})  # no time
    assert await kept.recall(ALICE) == {}


def modern_client(config) -> Client:
    return Client(StdioServerParameters(command=BASTION, args=["run", str(config), "-q"]), mode="2026-07-28",
                  read_timeout_seconds=DEADLINE)


async def test_what_one_request_read_holds_a_destructive_call_in_the_next(tmp_path) -> None:
    # No policy, so only the guardrail holds the call; a 2026-07-28 client cannot be asked in the middle of a call,
    # so a held call is refused with the reason. Each request is a session of its own: without the memory of the
    # earlier request the write would run (as the one before the page does). Expiry is the unit tests' (no timing
    # here). Notes is trusted, so that its own answers taint nothing.
    setup = cross_server_setup(tmp_path, {"web": {}, "notes": {"trust": "trusted"}}, policy="off")
    with anyio.fail_after(DEADLINE):
        async with modern_client(setup.config) as session:
            before = await session.call_tool("notes__write_note", {"text": "before"})
            page = await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__write_note", {"text": "tainted"})
            again = await session.call_tool("web__fetch_page", {"url": "https://example.com/"})  # its own server
    assert text_of(before) == "wrote before" and text_of(page) and text_of(again)
    message = refused.value.error.message
    assert "web__fetch_page" in message and "'write_note' on server 'notes' is not read-only" in message
    assert refused.value.error.data["taintedBy"] == [{"server": "web", "target": "tools/call web__fetch_page",
                                                      "reason": "untrusted server"}]
    lines = setup.event_lines()
    assert "notes write_note before" in lines
    assert not any("tainted" in line for line in lines)


async def test_cedar_sees_what_an_earlier_request_of_the_caller_read(tmp_path) -> None:
    rules = tmp_path / "taint.cedar"
    rules.write_text('''
@id("all")
permit (principal, action, resource);

@id("no-calls-after-web")
forbid (principal, action == Bastion::Action::"call_tool", resource)
when { context.session.tainted_by.contains("web") && resource.server != "web" };
''')
    setup = cross_server_setup(tmp_path, {"web": {}, "notes": {"trust": "trusted"}},
                               policy={"policy_files": [str(rules)], "audit": {"enabled": False}})
    with anyio.fail_after(DEADLINE):
        async with modern_client(setup.config) as session:
            before = await session.call_tool("notes__lookup", {"word": "tide"})
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__lookup", {"word": "tide"})
    assert text_of(before) == "tide: a word"
    assert "refused by policy" in refused.value.error.message
    assert refused.value.error.data["rule"] == "no-calls-after-web"
