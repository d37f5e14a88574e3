"""Secret and personal-data scanning through `bastion run` (a real process) in front of a real SDK server: the
official SDK client never sees a value the fixture leaks, in any place a model reads, while ordinary outputs pass
unchanged; blocking and per-server settings take effect; every intervention is a log line that names the kind and
never the value. Each test bounds itself with a generous deadline and asserts no duration."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.types import CreateMessageResult, EmbeddedResource, TextContent

from tests.fixtures import leaky_server as leaky
from tests.support import BASTION, FIXTURES, READY_TIMEOUT

DEADLINE = 120.0
LEAKED = [leaky.AWS_KEY, leaky.GITHUB_TOKEN, leaky.DB_PASSWORD, leaky.STRIPE_KEY, leaky.EMAIL, leaky.CARD, leaky.IBAN,
          leaky.PRIVATE_KEY.splitlines()[1]]


def _config(tmp_path: Path, guardrails: dict | None = None) -> Path:
    config = tmp_path / "bastion.json"
    top: dict = {"policy": "off", "ready_timeout": READY_TIMEOUT,
                 "servers": {"leaky": {"command": sys.executable, "args": [str(FIXTURES / "leaky_server.py")],
                                      "era": "legacy"}}}
    # Pins of the test's own: the user's pins file is shared by every Bastion process (and checkout) of the user.
    top["guardrails"] = {"pins": {"path": str(tmp_path / "pins.json")}, **(guardrails or {})}
    config.write_text(json.dumps(top))
    return config


class _Run:
    """One `bastion run` with its stderr in a file, and the sampling requests its client was asked."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.sampled: list = []

    async def on_sampling(self, _context, params) -> CreateMessageResult:
        self.sampled.append(params)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="summary"), model="m")

    def client(self) -> Client:
        # Through a shell only to keep Bastion's stderr (its log lines) in a file the test reads afterwards.
        command = 'exec "$0" run "$1" 2>>"$2"'
        return Client(StdioServerParameters(command="sh", args=["-c", command, BASTION, str(self.config), str(self.log)]),
                      mode="legacy", read_timeout_seconds=DEADLINE, sampling_callback=self.on_sampling)


def _dump(value) -> str:
    return json.dumps(value.model_dump(mode="json") if hasattr(value, "model_dump") else value)


def _assert_nothing_leaked(*answers) -> None:
    for answer in answers:
        text = _dump(answer)
        for value in LEAKED:
            assert value not in text, f"{value[:6]}… reached the client: {text[:300]}"


async def test_every_place_a_model_reads_is_redacted_and_ordinary_outputs_pass_unchanged(tmp_path):
    run = _Run(_config(tmp_path), tmp_path / "stderr.log")
    with anyio.fail_after(DEADLINE):
        async with run.client() as client:
            text = await client.call_tool("leaky__leak_text", {})
            structured = await client.call_tool("leaky__leak_structured", {})
            embedded = await client.call_tool("leaky__leak_embedded", {})
            with pytest.raises(MCPError) as error:
                await client.call_tool("leaky__leak_error", {})
            resource = await client.read_resource("leaky://config")
            prompt = await client.get_prompt("leaky__write_owner", {})
            summary = await client.call_tool("leaky__summarise", {})
            git_log = await client.call_tool("leaky__git_log", {})
            source = await client.call_tool("leaky__source_file", {})
    _assert_nothing_leaked(text, structured, embedded, error.value.error, resource, prompt, *run.sampled)
    said = text.content[0].text
    for kind in ("aws-access-key", "github-pat", "email", "payment-card", "iban"):
        assert f"[redacted: {kind}]" in said
    assert said.startswith("Deploy with AWS key [redacted: aws-access-key] and GITHUB_TOKEN=")
    assert structured.structured_content["database"] == {
        "url": "postgres://billing:[redacted: connection-string-password]@db.internal:5432/billing", "pool": 16}
    assert structured.structured_content["owners"] == ["[redacted: email]", "ops-team"]
    [intro, key_file] = embedded.content
    assert isinstance(key_file, EmbeddedResource) and key_file.resource.text == "[redacted: private-key]"
    assert intro.text == "Here is the key file:"
    assert "[redacted: stripe-access-token]" in error.value.error.message
    assert "[redacted: connection-string-password]" in resource.contents[0].text
    assert "[redacted: email]" in prompt.messages[0].content.text
    [asked] = run.sampled
    assert asked.messages[0].content.text == "Summarise: the key is [redacted: aws-access-key], the owner is [redacted: email]"
    assert summary.content[0].text == "summary"
    assert git_log.content[0].text == leaky.GIT_LOG
    assert source.content[0].text == leaky.SOURCE
    logged = run.log.read_text()
    assert "guardrail secrets redacted aws-access-key on server leaky, tools/call leaky__leak_text" in logged
    assert "guardrail pii redacted email on server leaky" in logged
    for value in LEAKED:
        assert value not in logged


async def test_a_large_result_is_scanned_to_its_end(tmp_path):
    run = _Run(_config(tmp_path), tmp_path / "stderr.log")
    with anyio.fail_after(DEADLINE):
        async with run.client() as client:
            big = await client.call_tool("leaky__big_result", {"size": 1_000_000})
    text = big.content[0].text
    assert len(text) > 1_000_000
    assert leaky.GITHUB_TOKEN not in text
    assert text.endswith("GITHUB_TOKEN=[redacted: github-pat]\n")
    assert text.startswith(leaky.SOURCE[:200])


async def test_blocking_per_kind_and_turning_a_server_off(tmp_path):
    blocking = _Run(_config(tmp_path, {"scanning": {"kinds": {"private-key": "block"}}}), tmp_path / "a.log")
    with anyio.fail_after(DEADLINE):
        async with blocking.client() as client:
            embedded = await client.call_tool("leaky__leak_embedded", {})
            text = await client.call_tool("leaky__leak_text", {})
    assert embedded.is_error
    [said] = embedded.content
    assert "private-key" in said.text and "withheld" in said.text
    _assert_nothing_leaked(embedded, text)
    assert "guardrail secrets blocked private-key on server leaky" in blocking.log.read_text()

    trusted = _Run(_config(tmp_path, {"servers": {"leaky": {"secrets": "off"}}}), tmp_path / "b.log")
    with anyio.fail_after(DEADLINE):
        async with trusted.client() as client:
            text = await client.call_tool("leaky__leak_text", {})
    said = text.content[0].text
    assert leaky.AWS_KEY in said and leaky.GITHUB_TOKEN in said  # secrets off for this server
    assert leaky.EMAIL not in said and "[redacted: email]" in said  # personal data still on


async def test_an_unknown_kind_is_a_clear_configuration_error(tmp_path):
    config = _config(tmp_path, {"scanning": {"servers": {"leaky": {"private-kee": "block"}}}})
    process = await anyio.run_process([BASTION, "check", str(config)], check=False)
    said = (process.stdout + process.stderr).decode()
    assert process.returncode != 0
    assert "private-kee" in said and "scanning" in said
