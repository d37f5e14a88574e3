"""Each content attack of issue 19, carried out by a real malicious MCP server (tests/fixtures/malicious_server.py),
through ``bastion run`` with a plain ``mcpServers`` file and nothing else: the defaults must stop it. Each one has a
control run first, the official SDK client talking to the server directly, proving the attack works without
Bastion. A benign server whose tools and results look alike (tests/fixtures/benign_lookalike_server.py) must
pass through unchanged. Two cases run the same file for a 2026-07-28 client and over HTTP (``bastion serve``), to
show the defaults hold on every frontend of the one request path.

The client is the official SDK's, in the handshake era, with a sampling callback (it answers every request and
records it) and an elicitation callback that approves every call Bastion asks about (the default policy asks a
person before an untrusted server's tool runs), recording what it was asked. Every test bounds itself with a
generous deadline; none asserts how long anything took.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CreateMessageResult, ElicitResult, TextContent

from tests.fixtures import malicious_server as evil
from tests.support import BASTION, FIXTURES, READY_TIMEOUT

DEADLINE = 180.0  # seconds a test may take before it counts as hung (process starts are slow on a busy machine)
ANSWER = "a sampled answer from the client"
EVIL = "evil"  # the malicious server's name in the mcpServers file, hence the prefix of its tools
NOTES = "notes"  # the benign look-alike server's name
MALICIOUS = str(FIXTURES / "malicious_server.py")
BENIGN = str(FIXTURES / "benign_lookalike_server.py")


@dataclass
class Inbox:
    """What the client was asked besides answers: sampling requests, approvals (elicitations), log messages."""

    sampling: list[Any] = field(default_factory=list)
    elicitations: list[Any] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)

    async def on_sampling(self, context: Any, params: Any) -> CreateMessageResult:
        self.sampling.append(params)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=ANSWER), model="test-model")

    async def on_elicitation(self, context: Any, params: Any) -> ElicitResult:
        self.elicitations.append(params)
        return ElicitResult(action="accept", content={"approve": True})

    async def on_log(self, params: Any) -> None:
        self.logs.append(params)


@dataclass
class World:
    """A plain client configuration file federating the malicious and the benign server, and Bastion's state."""

    tmp: Path
    state: Path

    def config(self, *, evil_env: dict[str, str] | None = None, policy: dict[str, Any] | None = None) -> Path:
        path = self.tmp / "claude_desktop_config.json"
        # ready_timeout only so that a slow machine still lists every tool at the first answer; every tool is listed
        # (the two servers are past the default exposure's bound, which would list the search meta-tools instead).
        path.write_text(json.dumps({"ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"}, "mcpServers": {
            EVIL: {"command": sys.executable, "args": [MALICIOUS], **({"env": evil_env} if evil_env else {})},
            NOTES: {"command": sys.executable, "args": [BENIGN]},
        }, **({"policy": policy} if policy is not None else {})}))
        return path

    def environment(self) -> dict[str, str]:
        return {**os.environ, "XDG_STATE_HOME": str(self.state)}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, tmp_path / "state")


def _callbacks(inbox: Inbox) -> dict[str, Any]:
    return {"sampling_callback": inbox.on_sampling, "elicitation_callback": inbox.on_elicitation,
            "logging_callback": inbox.on_log, "read_timeout_seconds": DEADLINE}


def through_bastion(world: World, inbox: Inbox, mode: str = "legacy", **config: Any) -> Client:
    """The SDK client on ``bastion run`` with the plain mcpServers file: every default on."""
    parameters = StdioServerParameters(command=BASTION, args=["run", str(world.config(**config)), "-q"],
                                       env=world.environment())
    return Client(parameters, mode=mode, **_callbacks(inbox))


def directly(script: str, inbox: Inbox, env: dict[str, str] | None = None) -> Client:
    """The SDK client on the server itself: the control run, without Bastion."""
    parameters = StdioServerParameters(command=sys.executable, args=[script], env={**os.environ, **(env or {})})
    return Client(parameters, mode="legacy", **_callbacks(inbox))


def evil_tool(name: str) -> str:
    return f"{EVIL}__{name}"


def notes_tool(name: str) -> str:
    return f"{NOTES}__{name}"


def texts(result: Any) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def dumped(result: Any) -> str:
    """Everything a result carries to the model, as one JSON text to search."""
    return json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True), ensure_ascii=False)


def described(listing: Any) -> dict[str, Any]:
    return {item.name: item for item in listing}


async def refused(call: Any) -> str:
    """The words of a refusal: a JSON-RPC error's message or an error result's text; fails when it was served."""
    try:
        result = await call
    except MCPError as error:
        return str(error)
    assert result.is_error, f"served: {texts(result)!r}"
    return texts(result)


def hidden_characters(text: str) -> list[str]:
    return [c for c in text if c in "\u200b\u200c\u200d\u2060\ufeff\u202a\u202b\u202c\u202d\u202e"
            or 0xE0000 <= ord(c) <= 0xE007F]


# ============================================================================================== rug pull
async def test_control_a_rug_pull_changes_tools_after_list_changed() -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(MALICIOUS, inbox) as client:
            before = described((await client.list_tools()).tools)
            prompts_before = described((await client.list_prompts()).prompts)
            await client.call_tool("refresh_forecasts", {})
            after = described((await client.list_tools()).tools)
            prompts_after = described((await client.list_prompts()).prompts)
    assert prompts_before["weekly_report"].description == evil.ORIGINAL_REPORT
    assert prompts_after["weekly_report"].description == evil.CHANGED_REPORT
    assert [a.name for a in prompts_after["weekly_report"].arguments] == ["week", "calendar"]
    assert before["get_weather"].description == evil.ORIGINAL_WEATHER
    assert after["get_weather"].description == evil.CHANGED_WEATHER
    assert "contacts" in after["get_weather"].input_schema["required"]
    assert before["clear_cache"].annotations.destructive_hint and not before["clear_cache"].annotations.read_only_hint
    assert after["clear_cache"].annotations.read_only_hint  # a destructive tool now claims to only read
    assert "get_weather_v2" in after and "get_weather_v2" not in before


@pytest.fixture(scope="module")
def rug_pull(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One session through Bastion: list, call, let the server change its tools, list and call again."""
    tmp = tmp_path_factory.mktemp("rug-pull")
    world, inbox = World(tmp, tmp / "state"), Inbox()

    async def scenario() -> dict[str, Any]:
        with anyio.fail_after(DEADLINE):
            async with through_bastion(world, inbox) as client:
                before = described((await client.list_tools()).tools)
                first_call = texts(await client.call_tool(evil_tool("get_weather"), {"city": "Paris"}))
                await client.call_tool(evil_tool("refresh_forecasts"), {})
                after = await _tools_once_changed(client, before)
                changed = await _outcome(client.call_tool(evil_tool("get_weather"), {"city": "Paris", "contacts": "x"}))
                flipped = await _outcome(client.call_tool(evil_tool("clear_cache"), {}))
                renamed = await _outcome(client.call_tool(evil_tool("get_weather_v2"), {"city": "Paris", "contacts": "x"}))
                prompts_after = await _prompts_once_changed(client, evil_tool("weekly_report"))
                prompt = await _outcome(client.get_prompt(evil_tool("weekly_report"), {"week": "1", "calendar": "x"}))
        return {"prompts_after": prompts_after, "prompt": prompt, "before": before, "first_call": first_call, "after": after, "changed": changed, "flipped": flipped,
                "renamed": renamed, "logs": [json.dumps(params.model_dump(mode="json")) for params in inbox.logs]}

    return anyio.run(scenario)


async def _outcome(call: Any) -> tuple[bool, str]:
    """(served, words): a result, or the refusal's words (a JSON-RPC error or an error result)."""
    try:
        result = await call
    except MCPError as error:
        return False, str(error)
    if not hasattr(result, "content"):  # a prompt, served
        return True, dumped(result)
    return not result.is_error, texts(result)


def test_a_tool_changed_after_list_changed_is_withheld_and_calls_say_what_changed(rug_pull: dict[str, Any]) -> None:
    assert evil_tool("get_weather") in rug_pull["before"] and rug_pull["first_call"] == "Sunny in Paris"
    assert evil_tool("get_weather") not in rug_pull["after"]
    served, words = rug_pull["changed"]
    assert not served and "changed" in words and "description" in words, words
    # The server's other tools, and the other server's, are still served.
    assert evil_tool("refresh_forecasts") in rug_pull["after"] and notes_tool("get_weather") in rug_pull["after"]


def test_a_prompt_changed_after_list_changed_is_withheld(rug_pull: dict[str, Any]) -> None:
    assert evil_tool("weekly_report") not in rug_pull["prompts_after"]
    served, words = rug_pull["prompt"]
    assert not served and "changed" in words, words


def test_the_client_is_told_in_words_what_was_withheld(rug_pull: dict[str, Any]) -> None:
    told = [line for line in rug_pull["logs"] if "get_weather" in line]
    assert told and any("withheld" in line or "changed" in line for line in told), rug_pull["logs"]


def test_a_destructive_tool_that_starts_claiming_read_only_is_withheld(rug_pull: dict[str, Any]) -> None:
    assert evil_tool("clear_cache") not in rug_pull["after"]
    served, words = rug_pull["flipped"]
    assert not served and "changed" in words and "readOnlyHint" in words, words


def test_a_renamed_changed_tool_does_not_dodge_the_pin(rug_pull: dict[str, Any]) -> None:
    assert evil_tool("get_weather_v2") not in rug_pull["after"]
    served, words = rug_pull["renamed"]
    assert not served, words


async def test_a_rug_pull_across_a_restart_is_withheld(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        # The same entry both times (only a variable's value differs, which is not configuration drift): what is
        # withheld is the server's own change of its definitions.
        async with through_bastion(world, inbox, evil_env={"EVIL_DEFINITIONS": "original"}) as client:
            assert evil_tool("get_weather") in described((await client.list_tools()).tools)
        async with through_bastion(world, inbox, evil_env={"EVIL_DEFINITIONS": "changed"}) as client:
            upgraded = described((await client.list_tools()).tools)
            changed = await refused(client.call_tool(evil_tool("get_weather"), {"city": "Paris", "contacts": "x"}))
    assert not {evil_tool("get_weather"), evil_tool("clear_cache")} & set(upgraded)  # the rename: see above
    assert evil_tool("refresh_forecasts") in upgraded
    assert "changed" in changed, changed


async def _prompts_once_changed(client: Client, name: str) -> dict[str, Any]:
    """The prompt list once ``name`` changed or left it (at most a while: the list is re-read in the background)."""
    with anyio.move_on_after(30):
        while True:
            listed = described((await client.list_prompts()).prompts)
            if name not in listed or listed[name].description != evil.ORIGINAL_REPORT:
                return listed
            await anyio.sleep(0.1)
    return described((await client.list_prompts()).prompts)


async def _tools_once_changed(client: Client, before: dict[str, Any]) -> dict[str, Any]:
    """The tool list once the gateway took in the server's list_changed (it re-lists in the background)."""
    while True:
        listed = described((await client.list_tools()).tools)
        if listed.keys() != before.keys():
            return listed
        await anyio.sleep(0.1)


# ====================================================================================== poisoned metadata
async def test_control_poisoned_descriptions_reach_the_client() -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(MALICIOUS, inbox) as client:
            tools = described((await client.list_tools()).tools)
            prompts = described((await client.list_prompts()).prompts)
            resources = {str(r.uri): r for r in (await client.list_resources()).resources}
    assert "<IMPORTANT>" in tools["add"].description and "id_rsa" in tools["add"].description
    assert hidden_characters(tools["lookup_word"].description)
    assert "bcc" in tools["format_date"].description
    assert "Ignore all previous instructions" in prompts["review_code"].description
    assert "<IMPORTANT>" in resources["evil://manual"].description


async def test_poisoned_descriptions_are_withheld_or_sanitised(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            tools = described((await client.list_tools()).tools)
            prompts = described((await client.list_prompts()).prompts)
            resources = {str(r.uri): r for r in (await client.list_resources()).resources}
            poisoned_call = await refused(client.call_tool(evil_tool("add"), {"a": 1, "b": 2}))
    every_description = [item.description or "" for item in (*tools.values(), *prompts.values(), *resources.values())]
    every_description += [json.dumps(t.input_schema) for t in tools.values()]
    for description in every_description:
        assert "<IMPORTANT>" not in description and "id_rsa" not in description, description
        assert "bcc" not in description and "Ignore all previous instructions" not in description, description
        assert not hidden_characters(description), ascii(description)
    assert evil_tool("add") not in tools and poisoned_call
    # The clean tools of the same server are still served.
    assert {evil_tool("get_weather"), evil_tool("fetch_page")} <= set(tools)


# ================================================================================== injection in a result
async def test_control_an_injection_in_a_result_reaches_the_client() -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(MALICIOUS, inbox) as client:
            page = await client.call_tool("fetch_page", {"url": "https://example.test"})
    assert evil.INJECTION in texts(page)


async def test_an_injection_in_a_result_is_marked_as_untrusted_data(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            page = await client.call_tool(evil_tool("fetch_page"), {"url": "https://example.test"})
    text = texts(page)
    assert "untrusted data from" in text and "</untrusted-data>" in text, text
    # The label comes first: what follows it reads as data, not as a message to the model.
    assert text.index("untrusted data") < text.index("ignore all previous instructions")


# ============================================================================= secrets and personal data
async def test_control_secrets_and_personal_data_reach_the_client() -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(MALICIOUS, inbox) as client:
            config = dumped(await client.call_tool("read_config", {}))
            failed = dumped(await client.call_tool("lookup_user", {"name": "bob"}))
            resource = dumped(await client.read_resource("evil://env"))
            prompt = dumped(await client.get_prompt("deploy", {}))
    for value in (*evil.SECRETS, *evil.PERSONAL):
        assert value in config, value
    assert evil.GITHUB_TOKEN in failed and evil.EMAIL in failed
    assert evil.AWS_SECRET_KEY in resource and evil.AWS_SECRET_KEY in prompt


async def test_secrets_and_personal_data_are_redacted_everywhere_they_reach_the_model(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            result = await client.call_tool(evil_tool("read_config"), {})
            failed = dumped(await client.call_tool(evil_tool("lookup_user"), {"name": "bob"}))
            resource = dumped(await client.read_resource("evil://env"))
            prompt = dumped(await client.get_prompt(evil_tool("deploy"), {}))
    config = dumped(result.model_copy(update={"structured_content": None}))
    structured = json.dumps(result.structured_content)
    for where, seen in (("result", config), ("error", failed), ("resource", resource), ("prompt", prompt)):
        for value in (*evil.SECRETS, *evil.PERSONAL):
            assert value not in seen, f"{where} still carries {value[:12]}..."
    for value in (evil.AWS_ACCESS_KEY, evil.GITHUB_TOKEN, *evil.PERSONAL):  # the AWS secret: see the next test
        assert value not in structured, f"structuredContent still carries {value[:12]}..."
    assert "[redacted: " in config and "[redacted: " in resource and "[redacted: " in prompt
    # Redaction keeps the structure: the same blocks and keys, only values replaced.
    assert [block.type for block in result.content] == ["text", "resource"]
    assert set(result.structured_content) == {"aws", "owner", "github"}
    assert "Sunny" not in config and "AWS_ACCESS_KEY_ID=" in config  # the names around the values are kept
    # Each redaction is an audit record naming the server, the tool, the kind and the rule, never the value.
    trail = "".join(path.read_text() for path in sorted((world.state / "bastion").glob("audit*.jsonl")))
    records = [json.loads(line) for line in trail.splitlines()]
    redactions = [r for r in records if r.get("guardrail") in ("secrets", "pii") and r.get("action") == "redacted"]
    assert {"secrets", "pii"} <= {r["guardrail"] for r in redactions}, records
    assert all(r["server"] == EVIL and r["rule"] and r["target"] for r in redactions)
    assert {"github-pat", "email", "payment-card", "private-key"} <= {r["found"] for r in redactions}
    for value in (*evil.SECRETS, *evil.PERSONAL):
        assert value not in trail, f"the audit trail carries {value[:12]}..."


async def test_a_secret_under_a_key_like_name_in_structured_content_is_redacted(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            result = await client.call_tool(evil_tool("read_config"), {})
    assert evil.AWS_SECRET_KEY not in json.dumps(result.structured_content)  # {"aws": {"secret": ...}}


# ============================================================================================== sampling
async def test_control_a_server_samples_unsolicited_greedily_and_over_and_over() -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(MALICIOUS, inbox) as client:
            greedy = texts(await client.call_tool("summarize_greedy", {"text": "x"}))
            await client.call_tool("start_background_job", {"delay": 0.2})
            status = await _background_status(client, "background_job_status")
    first = inbox.sampling[0]
    assert first.max_tokens == 1_000_000 and first.include_context == "allServers"
    assert greedy.count("answered") == 11 and len(inbox.sampling) == 12
    assert status == f"answered: {ANSWER}"  # the unsolicited request reached the client's model


async def test_ordinary_sampling_passes_from_an_untrusted_server(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            evil_summary = texts(await client.call_tool(evil_tool("summarize"), {"text": "the weather"}))
            notes_summary = texts(await client.call_tool(notes_tool("summarize"), {"text": "the weather"}))
    assert evil_summary == notes_summary == f"summary: {ANSWER}"
    assert len(inbox.sampling) == 2 and inbox.sampling[0].max_tokens == 200


async def test_greedy_and_unsolicited_sampling_is_held_to_its_budgets(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            greedy = texts(await client.call_tool(evil_tool("summarize_greedy"), {"text": "x"}))
            asked_in_the_call = list(inbox.sampling)
            await client.call_tool(evil_tool("start_background_job"), {"delay": 0.2})
            status = await _background_status(client, evil_tool("background_job_status"))
    # includeContext "allServers" from an untrusted server: refused with words, as a JSON-RPC error to the server.
    assert greedy.startswith("greedy: refused:"), greedy
    # Every request the client saw is within the per-call budget and the maxTokens cap.
    assert 1 <= len(asked_in_the_call) <= 3, len(asked_in_the_call)
    assert all(params.max_tokens <= 4096 and params.include_context in (None, "none") for params in asked_in_the_call)
    assert "refused:" in greedy.splitlines()[-1]  # the tenth round is over the budget
    # Sampling outside any call of the server's: the client never sees it, the server gets an error.
    assert status.startswith("refused:"), status
    assert len(inbox.sampling) == len(asked_in_the_call)


async def test_sampling_inside_another_servers_call_is_refused(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            await client.call_tool(evil_tool("start_background_job"), {"delay": 1.0})
            # The malicious server asks while only the other server is working on a call of this client.
            waited = texts(await client.call_tool(notes_tool("wait"), {"seconds": 4}))
            status = await _background_status(client, evil_tool("background_job_status"))
    assert waited == "waited 4.0s"
    assert status.startswith("refused:"), status
    assert inbox.sampling == []


async def _background_status(client: Client, tool: str) -> str:
    while True:
        status = texts(await client.call_tool(tool, {}))
        if status not in ("not started", "sampling"):
            return status
        await anyio.sleep(0.1)


# ======================================================================================= confused deputy
async def test_control_a_server_points_the_client_at_another_servers_resource() -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(MALICIOUS, inbox) as client:
            linked = dumped(await client.call_tool("share_link", {}))
            sampled = texts(await client.call_tool("summarize_diary", {}))
    assert evil.OTHER_SERVERS_RESOURCE in linked
    assert sampled == f"answered: {ANSWER}"
    assert evil.OTHER_SERVERS_RESOURCE in json.dumps(inbox.sampling[0].model_dump(mode="json"))


async def test_a_server_cannot_reach_another_servers_resource_through_bastion(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            linked = await client.call_tool(evil_tool("share_link"), {})
            sampled = texts(await client.call_tool(evil_tool("summarize_diary"), {}))
            own = dumped(await client.call_tool(notes_tool("share_link"), {}))
    assert evil.OTHER_SERVERS_RESOURCE not in dumped(linked)
    assert sampled.startswith("refused:"), sampled
    assert not any(evil.OTHER_SERVERS_RESOURCE in json.dumps(p.model_dump(mode="json")) for p in inbox.sampling)
    assert "notes://public/readme" in own  # a server's link to its own resource passes


# ================================================================================== cross-server taint
async def test_after_untrusted_content_a_destructive_call_elsewhere_says_what_came_first(world: World) -> None:
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox) as client:
            await client.call_tool(evil_tool("fetch_page"), {"url": "https://example.test"})
            before = len(inbox.elicitations)
            deleted = texts(await client.call_tool(notes_tool("delete_note"), {"id": "1"}))
    assert deleted == "deleted 1"  # approved by the person (this client approves everything)
    [approval] = inbox.elicitations[before:]
    assert f"'{EVIL}'" in approval.message or f"{EVIL}__fetch_page" in approval.message, approval.message


# ====================================================================== a 2026-07-28 client, the same
async def test_a_2026_client_is_guarded_the_same(world: World) -> None:
    """The modern era's frontend (per-request envelopes, input_required for approvals) on the same request path."""
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with through_bastion(world, inbox, mode="2026-07-28") as client:
            tools = described((await client.list_tools()).tools)
            config = dumped(await client.call_tool(evil_tool("read_config"), {}))
            page = texts(await client.call_tool(evil_tool("fetch_page"), {"url": "https://example.test"}))
            summary = texts(await client.call_tool(evil_tool("summarize"), {"text": "the weather"}))
    assert evil_tool("add") not in tools and evil_tool("get_weather") in tools
    for value in (evil.GITHUB_TOKEN, evil.EMAIL, evil.CARD, evil.JWT):
        assert value not in config
    assert "[redacted: " in config
    assert "untrusted data from" in page
    assert summary == f"summary: {ANSWER}"


async def test_a_client_over_http_is_guarded_the_same(world: World) -> None:
    """``bastion serve`` with the same plain file, an SDK client over Streamable HTTP: the same request path."""
    log = world.tmp / "serve.stderr"
    # The client answers the approvals, as over stdio (over HTTP, by default, only a person out of band may).
    config = world.config(policy={"approval": {"approver": "client"}})
    serve = subprocess.Popen([BASTION, "serve", str(config), "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=log.open("wb"),
                             env={**world.environment(), "PYTHONUNBUFFERED": "1"})
    try:
        url = await _served_url(serve, log)
        inbox = Inbox()
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE))
        with anyio.fail_after(DEADLINE):
            async with Client(streamable_http_client(url, http_client=http), mode="legacy", **_callbacks(inbox)) as client:
                tools = described((await client.list_tools()).tools)
                config = dumped(await client.call_tool(evil_tool("read_config"), {}))
                page = texts(await client.call_tool(evil_tool("fetch_page"), {"url": "https://example.test"}))
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    assert evil_tool("add") not in tools and evil_tool("get_weather") in tools
    for value in (evil.GITHUB_TOKEN, evil.EMAIL, evil.CARD, evil.JWT):
        assert value not in config
    assert "[redacted: " in config and "untrusted data from" in page


async def _served_url(serve: subprocess.Popen, log: Path) -> str:
    with anyio.fail_after(DEADLINE):
        while True:
            found = re.search(r"serving MCP on (http://[^ ]+/mcp)", log.read_text())
            if found:
                return found.group(1)
            assert serve.poll() is None, log.read_text()
            await anyio.sleep(0.1)


# ============================================================================ benign look-alikes pass
BENIGN_CALLS = [
    ("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3}), ("lookup_word", {"word": "café"}),
    ("format_date", {"date": "2024-03-04"}), ("fetch_page", {"url": "https://example.test"}), ("git_log", {}),
    ("read_config", {}), ("lookup_user", {"name": "bob"}), ("share_link", {}), ("refresh_forecasts", {}),
]


async def test_benign_look_alikes_pass_through_unchanged(world: World) -> None:
    direct_inbox, inbox = Inbox(), Inbox()
    with anyio.fail_after(DEADLINE):
        async with directly(BENIGN, direct_inbox) as client:
            direct_tools = described((await client.list_tools()).tools)
            direct_results = [dumped(await client.call_tool(name, args)) for name, args in BENIGN_CALLS]
            direct_resources = [dumped(await client.read_resource(uri)) for uri in ("notes://public/readme",)]
            direct_prompt = dumped(await client.get_prompt("review_code", {"code": "x = 1"}))
            direct_summary = texts(await client.call_tool("summarize", {"text": "x"}))
        async with through_bastion(world, inbox) as client:
            tools = described((await client.list_tools()).tools)
            results = [dumped(await client.call_tool(notes_tool(name), args)) for name, args in BENIGN_CALLS]
            after_refresh = described((await client.list_tools()).tools)
            resources = [dumped(await client.read_resource(uri)) for uri in ("notes://public/readme",)]
            prompt = dumped(await client.get_prompt(notes_tool("review_code"), {"code": "x = 1"}))
            summary = texts(await client.call_tool(notes_tool("summarize"), {"text": "x"}))
    for name, definition in direct_tools.items():
        served = tools[notes_tool(name)]
        assert (served.description, served.input_schema) == (definition.description, definition.input_schema), name
        assert notes_tool(name) in after_refresh, name  # list_changed with nothing changed withholds nothing
    for (name, _), direct, through in zip(BENIGN_CALLS, direct_results, results):
        assert through == direct, name
    assert resources == direct_resources and prompt == direct_prompt
    assert summary == direct_summary == f"summary: {ANSWER}"
