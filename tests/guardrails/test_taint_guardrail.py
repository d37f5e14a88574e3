"""Cross-server taint: its pure decisions, then a real ``bastion run`` with two SDK servers in front of an SDK
client that answers approval prompts. After content from an untrusted server, a call that is not read-only on the
other server waits for a person, and the prompt names the content that came first; the approval a person gave
before the taint does not carry over; "refuse" refuses; trusted content and read-only calls pass; Cedar sees
``context.session.tainted_by``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any, Callable

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters

from bastion.guardrails.taint import content_origin, held_by, read_only, record, tainting
from bastion.model import TAINTED_BY, Identity, Session, TaintSource, ToolEntry
from tests.guardrails.cross_server_support import DEADLINE, Person, Setup, client, cross_server_setup, text_of
from tests.support import BASTION

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

WEB_PAGE = TaintSource("web", "tools/call web__fetch_page", "untrusted server")
TAINT_NOTE = ("This session has read content that could steer the model: the answer to tools/call web__fetch_page "
              "from server 'web' (untrusted server)")


def tool(server: str, trust: str, **annotations: bool) -> ToolEntry:
    return ToolEntry(f"{server}__t", server, "t", {"name": f"{server}__t", "annotations": annotations}, trust)


def test_what_taints() -> None:
    # Content taints by where it comes from (the catalog's reason: open world, network, the user's mark) ...
    assert tainting("web", "its sandbox grants it the network", {}, "x") == \
        TaintSource("web", "x", "its sandbox grants it the network")
    # ... not by the server's trust: a local server nobody reviewed answers the time or a git status.
    assert tainting("time", None, {}, "x") is None
    # A tool that says it reaches the open world is believed from anyone: the claim asks for more care, not less.
    opened = tainting("mail", None, {}, "x", open_world_tool=True)
    assert opened is not None and "openWorldHint" in opened.reason
    flagged = tainting("docs", None, {"docs": "instructions to the model"}, "x")
    assert flagged is not None and flagged.reason == "flagged by the injection scan: instructions to the model"


def test_a_catalog_that_cannot_tell_where_content_comes_from_counts_untrusted_servers() -> None:
    class OldView:
        def server_trust(self, server: str) -> str:
            return {"web": "untrusted"}.get(server, "trusted")

        def tools(self) -> list:
            return []

    assert content_origin(OldView(), "web") == "untrusted server"  # type: ignore[arg-type]
    assert content_origin(OldView(), "git") is None  # type: ignore[arg-type]


def test_what_is_held() -> None:
    tainted = {"web": WEB_PAGE}
    assert held_by(tool("notes", "trusted", readOnlyHint=False), tainted) == [WEB_PAGE]
    assert held_by(tool("notes", "trusted", readOnlyHint=True), tainted) == []
    # An untrusted server's annotations do not count: its "read-only" tool is held like any other ...
    assert not read_only(tool("notes", "untrusted", readOnlyHint=True))
    assert held_by(tool("notes", "untrusted", readOnlyHint=True), tainted) == [WEB_PAGE]
    # ... unless Bastion counts it read-only itself (a reference package's read, a claim pinning holds still).
    vouched = dataclasses.replace(tool("notes", "untrusted"), reads_only=True)
    assert read_only(vouched) and held_by(vouched, tainted) == []
    assert held_by(tool("web", "untrusted"), tainted) == []  # a server's own content does not hold its own calls


def test_the_first_content_of_each_server_is_kept() -> None:
    session = Session(Identity("alice"), "legacy", "2025-11-25", {})
    assert record(session, WEB_PAGE)
    before = session.facts[TAINTED_BY]
    assert not record(session, TaintSource("web", "tools/call web__other", "untrusted server"))
    assert record(session, TaintSource("docs", "resources/read docs://a", "untrusted server"))
    assert list(session.facts[TAINTED_BY]) == ["web", "docs"] and session.facts[TAINTED_BY]["web"] is WEB_PAGE
    assert before == {"web": WEB_PAGE}  # replaced, not changed in place: the policy tells a new record by identity


def approvals_for(person: Person, tool_name: str) -> list[str]:
    return [request.message for request in person.elicitation_requests if f"'{tool_name}'" in request.message]


async def test_the_approval_prompt_names_the_content_that_came_first(tmp_path) -> None:
    setup = cross_server_setup(tmp_path)
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            before = await session.call_tool("notes__write_note", {"text": "before"})
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            after = await session.call_tool("notes__write_note", {"text": "after"})
    assert text_of(before) == "wrote before" and text_of(after) == "wrote after"
    first, second = approvals_for(person, "write_note")
    assert "could steer the model" not in first
    assert second.startswith(TAINT_NOTE)
    # One question for the tainted call: the policy asked, told of the taint, so the guardrail did not ask again; the
    # page's fetch asked nothing (a read-only claim of a tool whose name says no change, held still by pinning).
    assert len(person.elicitation_requests) == 2
    assert await setup.wait_for_event("notes write_note after")


async def test_an_approval_remembered_before_the_taint_is_asked_again(tmp_path) -> None:
    setup = cross_server_setup(tmp_path, policy={"approval": {"remember": "session", "fallback": "refuse"},
                                                 "audit": {"enabled": False}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            await session.call_tool("notes__write_note", {"text": "one"})
            await session.call_tool("notes__write_note", {"text": "two"})  # remembered: not asked
            asked_before_taint = len(approvals_for(person, "write_note"))
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            person.approve = False
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__write_note", {"text": "three"})
    assert asked_before_taint == 1
    last = person.elicitation_requests[-1].message
    assert TAINT_NOTE in last and "'write_note' on server 'notes'" in last
    assert "the person declined" in refused.value.error.message
    assert "web__fetch_page" in refused.value.error.message
    assert not any("write_note three" in line for line in setup.event_lines())


async def test_refuse_mode_and_what_passes(tmp_path) -> None:
    setup = cross_server_setup(tmp_path, {"web": {}, "notes": {"trust": "trusted"}, "docs": {"trust": "trusted"}},
                               policy="off", guardrails={"servers": {"notes": {"taint": "refuse"}}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            # Trusted content taints nothing: docs' answer does not hold a call on notes.
            await session.call_tool("docs__fetch_page", {"url": "https://example.com/"})
            clean = await session.call_tool("notes__write_note", {"text": "clean"})
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            # A read-only tool of a trusted server still runs.
            looked_up = await session.call_tool("notes__lookup", {"word": "tide"})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__write_note", {"text": "tainted"})
            # Without a policy the guardrail asks the person itself (docs is "approve", the default).
            asked = await session.call_tool("docs__write_note", {"text": "asked"})
    assert text_of(clean) == "wrote clean" and text_of(looked_up) == "tide: a word"
    error = refused.value.error
    assert "'write_note' on server 'notes' is not read-only" in error.message and "refuse" in error.message
    assert error.data["taintedBy"] == [{"server": "web", "target": "tools/call web__fetch_page",
                                        "reason": "untrusted server"}]
    assert text_of(asked) == "wrote asked"
    [question] = person.elicitation_requests
    assert question.message.startswith(TAINT_NOTE) and "'write_note' on server 'docs'" in question.message
    lines = setup.event_lines()
    assert "notes write_note clean" in lines and not any("tainted" in line for line in lines)


async def test_cedar_sees_the_sessions_taint(tmp_path) -> None:
    rules = tmp_path / "taint.cedar"
    rules.write_text('''
@id("all")
permit (principal, action, resource);

@id("no-calls-after-web")
forbid (principal, action == Bastion::Action::"call_tool", resource)
when { context.session.tainted_by.contains("web") && resource.server != "web" };
''')
    setup = cross_server_setup(tmp_path, policy={"policy_files": [str(rules)], "audit": {"enabled": False}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            before = await session.call_tool("notes__lookup", {"word": "tide"})
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            with pytest.raises(MCPError) as refused:
                await session.call_tool("notes__lookup", {"word": "tide"})
    assert text_of(before) == "tide: a word"
    assert "refused by policy" in refused.value.error.message
    assert refused.value.error.data["rule"] == "no-calls-after-web"


async def test_a_client_that_cannot_be_asked_gets_the_queue_and_the_queue_names_the_content(tmp_path) -> None:
    # No elicitation in this client: the default policy queues the call, and `bastion approvals` shows what came
    # first; the person's `bastion approve` is the approval the guardrail takes.
    queue = tmp_path / "queue"
    setup = cross_server_setup(tmp_path, policy={"approval": {"fallback": "queue", "queue_dir": str(queue)},
                                                 "audit": {"enabled": False}})
    plain = Client(StdioServerParameters(command=BASTION, args=["run", str(setup.config), "-q"]), mode="legacy",
                   read_timeout_seconds=DEADLINE)

    def pending() -> list[dict]:
        listed = subprocess.run([BASTION, "approvals", "--json", "--queue-dir", str(queue)], capture_output=True,
                                text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        return json.loads(listed.stdout)

    async def approve_each(count: int) -> list[dict]:
        seen: list[dict] = []
        while len(seen) < count:
            for waiting in await anyio.to_thread.run_sync(pending):
                seen.append(waiting)
                approved = await anyio.to_thread.run_sync(lambda: subprocess.run(
                    [BASTION, "approve", waiting["id"], "--queue-dir", str(queue)], capture_output=True, text=True,
                    timeout=60))
                assert approved.returncode == 0, approved.stderr
            await anyio.sleep(0.2)
        return seen

    with anyio.fail_after(DEADLINE):
        async with plain as session, anyio.create_task_group() as person:
            approvals: list[dict] = []

            async def approving() -> None:
                approvals.extend(await approve_each(1))

            person.start_soon(approving)
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            written = await session.call_tool("notes__write_note", {"text": "queued"})
    assert text_of(written) == "wrote queued"
    [only] = approvals  # the page's fetch is a read: it asks nobody
    assert only["tool"] == "write_note" and only["note"].startswith(TAINT_NOTE)
    assert await setup.wait_for_event("notes write_note queued")


async def test_a_tool_the_client_file_approves_in_advance_is_not_asked_about_unless_the_scan_flagged_content(
        tmp_path) -> None:
    # autoApprove / alwaysAllow (auto_approve) covers the taint guardrail's question as it covers the policy's ...
    for folder in ("plain", "flagged"):
        (tmp_path / folder).mkdir()
    setup = cross_server_setup(tmp_path / "plain", {"web": {}, "notes": {"auto_approve": ["write_note"]}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
            written = await session.call_tool("notes__write_note", {"text": "after the page"})
    assert text_of(written) == "wrote after the page" and person.elicitation_requests == []

    # ... but not after content the injection scan flagged as instructions to the model: then a person is asked.
    flagged = cross_server_setup(tmp_path / "flagged", {"web": {"trust": "trusted"},
                                                        "notes": {"auto_approve": ["write_note"]}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(flagged, person) as session:
            await session.call_tool("web__poisoned_page", {})
            written = await session.call_tool("notes__write_note", {"text": "after the poisoned page"})
    assert text_of(written) == "wrote after the poisoned page"
    [asked] = approvals_for(person, "write_note")
    assert "flagged by the injection scan" in asked


def open_policy_with_a_queue(tmp_path, **approval: object) -> tuple[Setup, Path]:
    """Two servers behind a policy that lets every call run unasked (so the taint guardrail asks on its own), with an
    approval queue; the setup and the queue's folder."""
    queue = tmp_path / "queue"
    policy_file = tmp_path / "open.cedar"
    policy_file.write_text("permit (principal, action, resource);\n")
    setup = cross_server_setup(tmp_path, policy={"policy_files": [str(policy_file)],
                                                 "approval": {**approval, "queue_dir": str(queue),
                                                              "poll_seconds": 0.1},
                                                 "audit": {"enabled": False}})
    return setup, queue


def approve_the_first_queued(queue: Path, settled: Callable[[], bool]) -> dict | None:
    """What a person at another terminal does: `bastion approve` the first call waiting in the queue, and return it;
    None when the session settled without anything queued."""
    while not settled():
        listed = subprocess.run([BASTION, "approvals", "--json", "--queue-dir", str(queue)], capture_output=True,
                                text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        waiting = json.loads(listed.stdout)
        if waiting:
            approved = subprocess.run([BASTION, "approve", waiting[0]["id"], "--queue-dir", str(queue)],
                                      capture_output=True, text=True, timeout=60)
            assert approved.returncode == 0, approved.stderr
            return waiting[0]
    return None


async def write_after_the_page(session, queue: Path, text: str) -> tuple[Any, dict | None]:
    """Read the web page, then write a note while a person approves from the queue; the write's result and what the
    person approved."""
    settled = False
    queued: list[dict | None] = []

    async def approving() -> None:
        queued.append(await anyio.to_thread.run_sync(approve_the_first_queued, queue, lambda: settled))

    async with anyio.create_task_group() as outside:
        outside.start_soon(approving)
        await session.call_tool("web__fetch_page", {"url": "https://example.com/"})
        try:
            written = await session.call_tool("notes__write_note", {"text": text})
        finally:
            settled = True
    return written, queued[0]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_held_call_the_client_cannot_be_asked_about_waits_in_the_queue_instead_of_failing(
        tmp_path, mode: str) -> None:
    # The client takes no elicitation (and a 2026-07-28 client cannot be asked in the middle of a call), so the
    # taint guardrail's question goes to the approval queue, and `bastion approve` runs the call.
    setup, queue = open_policy_with_a_queue(tmp_path, fallback="queue")
    plain = Client(StdioServerParameters(command=BASTION, args=["run", str(setup.config), "-q"]), mode=mode,
                   read_timeout_seconds=DEADLINE)
    with anyio.fail_after(DEADLINE):
        async with plain as session:
            written, approved = await write_after_the_page(session, queue, "queued by the guardrail")
    assert text_of(written) == "wrote queued by the guardrail"
    assert approved is not None and approved["tool"] == "write_note" and "could steer the model" in approved["note"]
    assert await setup.wait_for_event("notes write_note queued by the guardrail")


async def test_the_taint_guardrail_asks_only_whom_the_approver_setting_names(tmp_path) -> None:
    # policy.approval.approver = "out_of_band": the client is never asked, even one that takes elicitation (over
    # HTTP it is most often the agent itself, which would approve its own call); the question goes to the queue.
    setup, queue = open_policy_with_a_queue(tmp_path, approver="out_of_band")
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            written, approved = await write_after_the_page(session, queue, "approved out of band")
    assert text_of(written) == "wrote approved out of band"
    assert person.elicitation_requests == []
    assert approved is not None and approved["tool"] == "write_note" and "could steer the model" in approved["note"]
