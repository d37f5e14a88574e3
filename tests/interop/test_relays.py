"""The official SDK client → ``bastion run`` (a real subprocess) → an SDK-written fixture server, for every pairing
of client mode (legacy, 2026-07-28) and upstream era (legacy, modern): what Bastion relays, in both directions.

Every test bounds itself with a generous deadline so a relay that hangs fails instead of stalling the suite; no
test asserts how long anything took.
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import (
    BlobResourceContents,
    CreateMessageResult,
    ElicitResult,
    EmbeddedResource,
    ImageContent,
    PromptReference,
    ResourceUpdatedNotification,
    ServerNotification,
    TextContent,
    TextResourceContents,
    ToolListChangedNotification,
)

from tests.support import BASTION, FIXTURES, READY_TIMEOUT

# The handshake-era calls under test (subscribe, setLevel) are deprecated in the SDK, which is the point here.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

MODES = ["legacy", "2026-07-28"]
ERAS = ["legacy", "modern"]
SERVER = "fx"  # the fixture's name in the configuration, hence the prefix of its tools and prompts
TEST_IMAGE_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WATCHED_URI = "test://watched-resource"
DEADLINE = 120.0  # seconds any one test may take before it counts as hung
LLM_ANSWER = "a sampled answer from the client"
UPSTREAM_UNAVAILABLE = -32001
INVALID_PARAMS = -32602


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture(params=ERAS)
def era(request) -> str:
    return request.param


@dataclass
class Setup:
    """One Bastion configuration federating the fixture server, and the file the fixture records events in."""

    config: Path
    events: Path

    def event_lines(self) -> list[str]:
        return self.events.read_text().splitlines() if self.events.exists() else []

    async def wait_for_event(self, line: str, timeout: float = 60.0) -> None:
        with anyio.fail_after(timeout):
            while line not in self.event_lines():
                await anyio.sleep(0.05)


@pytest.fixture
def setup(tmp_path: Path, era: str) -> Setup:
    return _setup_for(tmp_path, era)


def _setup_for(tmp_path: Path, era: str, *, env: dict[str, str] | None = None, **top_level: Any) -> Setup:
    events = tmp_path / "events.log"
    config = tmp_path / "bastion.json"
    # Policy off: these tests are about what the relays carry, not what the policy lets through.
    # The whole catalog from the first answer (tests/test_startup.py tests the client's short wait itself).
    # Every tool listed: the fixture's 25 tools would get search mode from the default exposure, "auto".
    config.write_text(json.dumps({"policy": "off", "tools": {"exposure": "all"}, "ready_timeout": READY_TIMEOUT, **top_level,
                                  "servers": {SERVER: {
        "command": sys.executable,
        "args": [str(FIXTURES / "sdk_server.py")],
        "env": {"FIXTURE_EVENTS": str(events), **(env or {})},
        "era": era,
        # Far beyond every deadline here: an answer that arrives means Bastion answered, not that it timed out.
        "request_timeout": 900,
        # The default sandbox stays on, as in real use; the fixture may only write its events file's directory.
        "sandbox": {"writable": [str(tmp_path)]},
    }}}))
    return Setup(config, events)


@dataclass
class Inbox:
    """What the client received besides answers: notifications, sampling and elicitation requests."""

    notifications: list[Any] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    sampling_requests: list[Any] = field(default_factory=list)
    elicitation_requests: list[Any] = field(default_factory=list)

    async def on_message(self, message: Any) -> None:
        if isinstance(message, ServerNotification):
            self.notifications.append(message)

    async def on_log(self, params: Any) -> None:
        self.logs.append(params)

    async def on_sampling(self, context: Any, params: Any) -> CreateMessageResult:
        self.sampling_requests.append(params)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=LLM_ANSWER), model="test-model")

    async def on_elicitation(self, context: Any, params: Any) -> ElicitResult:
        self.elicitation_requests.append(params)
        return ElicitResult(action="accept", content={"response": "yes please"})

    def of_type(self, kind: type) -> list[Any]:
        return [n for n in self.notifications if isinstance(n, kind)]

    async def wait_for(self, kind: type, timeout: float = 60.0) -> Any:
        with anyio.fail_after(timeout):
            while not self.of_type(kind):
                await anyio.sleep(0.05)
        return self.of_type(kind)[0]


def bastion_client(setup: Setup, mode: str, inbox: Inbox | None = None, **kwargs: Any) -> Client:
    if inbox is not None:
        kwargs = {"message_handler": inbox.on_message, "logging_callback": inbox.on_log,
                  "sampling_callback": inbox.on_sampling, "elicitation_callback": inbox.on_elicitation, **kwargs}
    return Client(StdioServerParameters(command=BASTION, args=["run", str(setup.config), "-q"]), mode=mode,
                  read_timeout_seconds=DEADLINE, **kwargs)


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def tool(name: str) -> str:
    return f"{SERVER}__{name}"


# ------------------------------------------------------------------------------------------------- tools
async def test_tool_content_kinds(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            text = await client.call_tool(tool("test_simple_text"), {})
            image = await client.call_tool(tool("test_image_content"), {})
            embedded = await client.call_tool(tool("test_embedded_resource"), {})
            failing = await client.call_tool(tool("test_error_handling"), {})
    assert {tool("test_simple_text"), tool("test_sampling"), tool("test_slow_cancellable")} <= names
    assert text_of(text) == "This is a simple text response for testing."
    assert not text.is_error
    [picture] = image.content
    assert isinstance(picture, ImageContent) and picture.mime_type == "image/png"
    assert picture.data == TEST_IMAGE_BASE64
    [block] = embedded.content
    assert isinstance(block, EmbeddedResource) and isinstance(block.resource, TextResourceContents)
    assert block.resource.uri == "test://embedded-resource"
    assert block.resource.text == "This is an embedded resource content."
    assert failing.is_error
    assert "intentionally returns an error" in text_of(failing)


# --------------------------------------------------------------------------------------------- resources
async def test_resources_read_and_templates(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            listed = {str(r.uri) for r in (await client.list_resources()).resources}
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            static_text = await client.read_resource("test://static-text")
            static_binary = await client.read_resource("test://static-binary")
            templated = await client.read_resource("test://template/42/data")
    assert {"test://static-text", "test://static-binary", WATCHED_URI} <= listed
    assert "test://template/{id}/data" in templates
    [text] = static_text.contents
    assert isinstance(text, TextResourceContents) and text.text == "This is the content of the static text resource."
    [blob] = static_binary.contents
    assert isinstance(blob, BlobResourceContents) and blob.mime_type == "image/png"
    assert base64.b64decode(blob.blob) == base64.b64decode(TEST_IMAGE_BASE64)
    [data] = templated.contents
    assert json.loads(data.text) == {"id": "42", "templateTest": True, "data": "Data for ID: 42"}


async def test_resource_subscription_delivers_updates(setup, mode):
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode, inbox) as client:
            if mode == "legacy":
                await client.subscribe_resource(WATCHED_URI)
                await client.call_tool(tool("test_touch_watched_resource"), {})
                updated = await inbox.wait_for(ResourceUpdatedNotification)
                assert str(updated.params.uri) == WATCHED_URI
            else:
                async with client.listen(resource_subscriptions=[WATCHED_URI]) as subscription:
                    await client.call_tool(tool("test_touch_watched_resource"), {})
                    async for event in subscription:
                        assert getattr(event, "uri", None) == WATCHED_URI
                        break


# ----------------------------------------------------------------------------------- prompts, completion
async def test_prompts(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
            simple = await client.get_prompt(tool("test_simple_prompt"))
            with_args = await client.get_prompt(tool("test_prompt_with_arguments"), {"arg1": "one", "arg2": "two"})
    assert {tool("test_simple_prompt"), tool("test_prompt_with_arguments")} <= set(prompts)
    assert {a.name for a in prompts[tool("test_prompt_with_arguments")].arguments or []} == {"arg1", "arg2"}
    assert simple.messages[0].content.text == "This is a simple prompt for testing."
    assert with_args.messages[0].content.text == "Prompt with arguments: arg1='one', arg2='two'"


async def test_prompt_argument_completion(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            result = await client.complete(PromptReference(type="ref/prompt", name=tool("test_prompt_with_arguments")),
                                           {"name": "arg1", "value": "al"})
    assert result.completion.values == ["alpha", "alpine"]


# ------------------------------------------------------------------------------ progress and log messages
async def test_progress_reaches_the_callback(setup, mode):
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            result = await client.call_tool(tool("test_tool_with_progress"), {}, progress_callback=on_progress)
            while len(seen) < 3:
                await anyio.sleep(0.05)
    assert text_of(result) == "progress reported"
    assert [(p, t) for p, t, _ in seen] == [(0, 100), (50, 100), (100, 100)]
    assert seen[-1][2] == "Completed step 100 of 100"


async def test_log_messages_are_relayed(setup, mode, era):
    # Each era's opt-in at "info": logging/setLevel for a legacy client, the per-request log level for a modern one.
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode, inbox, log_level="info") as client:
            if mode == "legacy":
                await client.set_logging_level("info")
            result = await client.call_tool(tool("test_tool_with_logging"), {})
            while len(inbox.logs) < 3:
                await anyio.sleep(0.05)
    assert text_of(result) == "Tool with logging executed successfully"
    assert [entry.data for entry in inbox.logs] == [
        "Tool execution started", "Tool processing data", "Tool execution completed"]
    assert {entry.level for entry in inbox.logs} == {"info"}
    assert {entry.logger for entry in inbox.logs} == {f"{SERVER}/conformance-test-server"}
    if mode == "legacy" and era == "legacy":
        assert "set-level info" in setup.event_lines()


async def test_legacy_client_gets_logs_without_set_level(request, setup, era):
    # A handshake-era client that never sent logging/setLevel gets every level from a legacy server, through
    # Bastion too; the same client in front of a modern server should not get silence instead.
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, "legacy", inbox) as client:
            await client.call_tool(tool("test_tool_with_logging"), {})
            while len(inbox.logs) < 3:
                await anyio.sleep(0.05)
    assert [entry.data for entry in inbox.logs][-1] == "Tool execution completed"


# ------------------------------------------------------------------------ sampling and elicitation relays
async def test_sampling_and_elicitation_reach_a_legacy_client(setup, era):
    # From a modern server these arrive as input_required rounds that Bastion drives against the legacy client.
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, "legacy", inbox) as client:
            sampled = await client.call_tool(tool("test_sampling"), {"prompt": "What is 2+2?"})
            elicited = await client.call_tool(tool("test_elicitation"), {"message": "Proceed?"})
    assert text_of(sampled) == f"LLM response: {LLM_ANSWER}"
    [request] = inbox.sampling_requests
    assert request.messages[0].content.text == "What is 2+2?"
    assert text_of(elicited) == "User response: action=accept, content={'response': 'yes please'}"
    [question] = inbox.elicitation_requests
    assert question.message == "Proceed?"


async def test_sampling_and_elicitation_from_a_legacy_server_reach_a_modern_client_as_input_required(tmp_path):
    # The legacy server asks with requests of its own mid-call; Bastion answers the modern client's call with
    # input_required, and the client's retry brings the answers back to the server, whose call then completes.
    setup_ = _setup_for(tmp_path, "legacy")
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup_, "2026-07-28", inbox) as client:
            sampled = await client.call_tool(tool("test_sampling"), {"prompt": "What is 2+2?"})
            elicited = await client.call_tool(tool("test_elicitation"), {"message": "Proceed?"})
    assert text_of(sampled) == f"LLM response: {LLM_ANSWER}"
    [request] = inbox.sampling_requests
    assert request.messages[0].content.text == "What is 2+2?"
    assert text_of(elicited) == "User response: action=accept, content={'response': 'yes please'}"
    [question] = inbox.elicitation_requests
    assert question.message == "Proceed?"


async def test_sampling_input_required_from_a_modern_server_reaches_a_modern_client(tmp_path):
    setup_ = _setup_for(tmp_path, "modern")
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup_, "2026-07-28", inbox) as client:
            sampled = await client.call_tool(tool("test_sampling"), {"prompt": "What is 2+2?"})
            elicited = await client.call_tool(tool("test_elicitation"), {"message": "Proceed?"})
    assert text_of(sampled) == f"LLM response: {LLM_ANSWER}"
    assert text_of(elicited) == "User response: action=accept, content={'response': 'yes please'}"
    assert len(inbox.sampling_requests) == 1 and len(inbox.elicitation_requests) == 1


# ------------------------------------------------------------------------------------------ list_changed
async def test_tools_list_changed_reaches_the_client(setup, mode):
    inbox = Inbox()
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode, inbox) as client:
            before = {t.name for t in (await client.list_tools()).tools}
            if mode == "legacy":
                await client.call_tool(tool("test_add_dynamic_tool"), {})
                await inbox.wait_for(ToolListChangedNotification)
            else:
                async with client.listen(tools_list_changed=True) as subscription:
                    await client.call_tool(tool("test_add_dynamic_tool"), {})
                    async for _event in subscription:
                        break
            after = {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}
            dynamic = await client.call_tool(tool("test_dynamic_tool"), {})
    assert tool("test_dynamic_tool") not in before
    assert after - before == {tool("test_dynamic_tool")}
    assert text_of(dynamic) == "dynamic tool called"


# ---------------------------------------------------------------------------------------------- errors
async def test_unknown_tool_is_invalid_params(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            with pytest.raises(MCPError) as raised:
                await client.call_tool(tool("no_such_tool"), {})
    assert raised.value.error.code == INVALID_PARAMS
    assert "no_such_tool" in raised.value.error.message


async def test_bad_params_are_rejected(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            with pytest.raises(MCPError) as missing_argument:
                await client.get_prompt(tool("test_prompt_with_arguments"), {"arg1": "only one"})
            with pytest.raises(MCPError) as unknown_prompt:
                await client.complete(PromptReference(type="ref/prompt", name=tool("no_such_prompt")),
                                      {"name": "arg1", "value": ""})
            with pytest.raises(MCPError) as unknown_resource:
                await client.read_resource("test://no-such-resource")
            wrong_type = await client.call_tool(tool("test_slow_cancellable"), {"tag": {"not": "a string"}})
            still_fine = await client.call_tool(tool("test_simple_text"), {})
    # The code and text of a server's own refusal are the SDK's (they differ by era); Bastion relays them as sent.
    assert missing_argument.value.error.message
    assert unknown_prompt.value.error.code == INVALID_PARAMS
    assert unknown_resource.value.error.code in (INVALID_PARAMS, -32002)
    assert "test://no-such-resource" in unknown_resource.value.error.message
    assert wrong_type.is_error and "tag" in text_of(wrong_type)
    assert not still_fine.is_error


# ------------------------------------------------------------------------------- cancellation and crashes
async def test_cancellation_reaches_the_server(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            async with anyio.create_task_group() as group:
                async def slow_call() -> None:
                    await client.call_tool(tool("test_slow_cancellable"), {"tag": "first"})

                group.start_soon(slow_call)
                await setup.wait_for_event("slow-started first")
                group.cancel_scope.cancel()
            await setup.wait_for_event("slow-cancelled first")
            after = await client.call_tool(tool("test_simple_text"), {})
    assert not after.is_error


async def test_crash_mid_call_fails_at_once_and_the_server_comes_back(setup, mode):
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup, mode) as client:
            with pytest.raises(MCPError) as crashed:
                await client.call_tool(tool("test_crash"), {})
            recovered = None
            while recovered is None:
                try:
                    recovered = await client.call_tool(tool("test_simple_text"), {})
                except MCPError as exc:
                    assert exc.error.code == UPSTREAM_UNAVAILABLE, exc.error.message
                    await anyio.sleep(0.2)
    assert crashed.value.error.code == UPSTREAM_UNAVAILABLE
    assert repr(SERVER) in crashed.value.error.message and "tools/call" in crashed.value.error.message
    assert text_of(recovered) == "This is a simple text response for testing."
    starts = [line for line in setup.event_lines() if line.startswith("start ")]
    assert len(starts) == 2 and starts[0] != starts[1]


async def test_server_that_exits_during_the_handshake_is_restarted_at_once(tmp_path, mode, era):
    # The first start exits before answering; the restart serves. The handshake may wait 900 s, the client's first
    # request waits 45 s for the server, so the call below only succeeds if the exit itself is noticed.
    setup_ = _setup_for(tmp_path, era, env={"FIXTURE_EXIT_ON_FIRST_START": "1"}, ready_timeout=45)
    config = json.loads(setup_.config.read_text())
    config["servers"][SERVER]["startup_timeout"] = 900
    setup_.config.write_text(json.dumps(config))
    with anyio.fail_after(DEADLINE):
        async with bastion_client(setup_, mode) as client:
            result = await client.call_tool(tool("test_simple_text"), {})
    assert text_of(result) == "This is a simple text response for testing."
    assert setup_.event_lines()[0] == "exit-at-start"
    assert setup_.event_lines()[1].startswith("start ")
