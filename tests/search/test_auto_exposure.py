"""Exposure "auto", the default: every tool while the catalog is small, search mode past 10 tools or 5,000 tokens of
definitions, decided again when the catalog changes, and said in the log with the counts."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bastion.compose import build_gateway
from bastion.config import GatewayConfig
from bastion.search.auto import MAX_LISTED_TOKENS, MAX_LISTED_TOOLS, CatalogSize, measure
from tests.support import BASTION, READY_TIMEOUT, ROOT, RawClient, raw_server

RAW_TOOLS = 7  # what tests/fixtures/raw_server.py lists without extras


def _extra(count: int, description: str = "An extra tool") -> list[dict]:
    return [{"name": f"extra_{i}", "description": description, "inputSchema": {"type": "object"}} for i in range(count)]


def _config(tmp_path, extra_tools=(), **settings):
    entry = raw_server(env={"RAW_SERVER_EXTRA_TOOLS": json.dumps(list(extra_tools))})
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"raw": entry}, "policy": "off", "guardrails": "off",
                                  "ready_timeout": READY_TIMEOUT, **settings}))
    return config


def _listed(client: RawClient, request_id: int) -> set[str]:
    return {tool["name"] for tool in client.request(request_id, "tools/list", {})["result"]["tools"]}


def _auto_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "tool exposure auto" in line]


def test_a_small_catalog_is_listed_whole_by_default(tmp_path):
    client = RawClient(_config(tmp_path, _extra(MAX_LISTED_TOOLS - RAW_TOOLS)))  # exactly 10 tools: still small
    try:
        client.initialize()
        listed = _listed(client, 1)
        assert len(listed) == MAX_LISTED_TOOLS and "raw__echo" in listed and "search_tools" not in listed
        echoed = client.request(2, "tools/call", {"name": "raw__echo", "arguments": {"text": "hi"}})
        assert echoed["result"]["content"][0]["text"] == "hi"
    finally:
        _, stderr = client.close()
    [line] = _auto_lines(stderr)
    assert "10 tools" in line and "every tool" in line, stderr


def test_past_ten_tools_clients_get_search_mode_and_the_log_says_why(tmp_path):
    log = tmp_path / "bastion.log"
    client = RawClient(_config(tmp_path, _extra(MAX_LISTED_TOOLS - RAW_TOOLS + 1)), log=log)
    try:
        client.initialize()
        assert _listed(client, 1) == {"search_tools", "call_tool"}
        found = client.request(2, "tools/call", {"name": "search_tools", "arguments": {"query": "echo text back"}})
        assert "raw__echo" in [t["name"] for t in found["result"]["structuredContent"]["tools"]]
        # With the policy and guardrails off the frontend leaves a call's params as the client's bytes: the
        # meta-tool's own arguments are decoded, and the call it makes reaches the server.
        via_meta = client.request(3, "tools/call", {"name": "call_tool", "arguments": {
            "name": "raw__echo", "arguments": {"text": "through call_tool"}}})
        assert via_meta["result"]["content"][0]["text"] == "through call_tool"
        direct = client.request(4, "tools/call", {"name": "raw__echo", "arguments": {"text": "direct"}})
        assert direct["result"]["content"][0]["text"] == "direct"
        # The tokens are counted after the switch, which does not wait for them.
        deadline = time.monotonic() + 60
        while len(_auto_lines(log.read_text())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        client.close()
    stderr = log.read_text()
    line, counted = _auto_lines(stderr)
    assert "11 tools" in line and "search_tools and call_tool" in line, stderr
    tokens = int(counted.split("definitions are ")[1].split(" o200k_base")[0].replace(",", ""))
    assert "the 11 tools' definitions" in counted and tokens > 100, stderr


def test_a_few_tools_with_long_definitions_get_search_mode_by_their_tokens(tmp_path):
    wordy = " ".join(f"word{i}" for i in range(4000))  # a few tools, but thousands of tokens each
    client = RawClient(_config(tmp_path, _extra(2, wordy)))
    try:
        client.initialize()
        assert _listed(client, 1) == {"search_tools", "call_tool"}
    finally:
        _, stderr = client.close()
    [line] = _auto_lines(stderr)
    tokens = int(line.split(" tools, ")[1].split(" o200k_base tokens")[0].replace(",", ""))
    assert tokens > MAX_LISTED_TOKENS and f"{RAW_TOOLS + 2} tools" in line, stderr


def test_a_vocabulary_that_cannot_be_had_leaves_every_tool_listed_and_says_why(tmp_path, monkeypatch):
    # An operator's model directory without tiktoken's files: the tokens of a few long definitions cannot be counted.
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("BASTION_MODEL_DIR", str(models))
    wordy = " ".join(f"word{i}" for i in range(4000))
    client = RawClient(_config(tmp_path, _extra(2, wordy)))
    try:
        client.initialize()
        assert len(_listed(client, 1)) == RAW_TOOLS + 2
        assert len(_listed(client, 2)) == RAW_TOOLS + 2  # asked again: still answered, counted no more
    finally:
        _, stderr = client.close()
    [warning] = [line for line in stderr.splitlines() if "could not count" in line]
    assert str(models / "o200k_base.tiktoken") in warning and "is missing" in warning, stderr
    [line] = _auto_lines(stderr.replace(warning, ""))
    assert "bytes of definitions" in line and "every tool" in line, stderr


def test_a_catalog_that_grows_past_the_bound_switches_to_search_mode_and_says_so(tmp_path):
    client = RawClient(_config(tmp_path))
    try:
        client.initialize()
        assert "raw__rewrite" in _listed(client, 1)
        long_description = " ".join(f"token{i}" for i in range(6000))
        client.request(2, "tools/call", {"name": "raw__rewrite", "arguments": {"description": long_description}})
        deadline = time.monotonic() + 60  # the gateway re-reads the server's list after its list_changed
        request_id = 3
        while _listed(client, request_id) != {"search_tools", "call_tool"}:
            if time.monotonic() > deadline:
                pytest.fail("the catalog grew past the bound and clients still saw every tool")
            request_id += 1
            time.sleep(0.1)
    finally:
        _, stderr = client.close()
    lines = _auto_lines(stderr)
    assert len(lines) == 2, lines
    first, switched = lines
    assert "every tool" in first and "search_tools and call_tool from now on" in switched, stderr


@pytest.mark.parametrize("exposure, expected", [("all", RAW_TOOLS + 4), ("search", 2)])
def test_all_and_search_stay_as_they_were(tmp_path, exposure, expected):
    client = RawClient(_config(tmp_path, _extra(4), tools={"exposure": exposure}))
    try:
        client.initialize()
        assert len(_listed(client, 1)) == expected
    finally:
        _, stderr = client.close()
    assert not _auto_lines(stderr)


def test_the_size_is_measured_only_as_far_as_the_decision_needs():
    counted: list[bytes] = []

    def counter():
        def count(blob: bytes) -> int:
            counted.append(blob)
            return len(blob) // 3
        return count

    many = measure(_extra(11), counter)
    assert many == CatalogSize(11) and many.needs_search and not counted  # the tool count decided
    small = measure(_extra(3), counter)
    assert small.tokens is None and small.bytes is not None and not small.needs_search and not counted
    long = measure(_extra(3, "x " * 9000), counter)
    assert len(counted) == 1 and long.tokens == len(counted[0]) // 3 and long.needs_search


async def test_a_small_catalog_keeps_the_byte_pass_through_of_calls():
    config = GatewayConfig.model_validate({"servers": {"raw": raw_server()}, "policy": "off", "guardrails": "off"})
    gateway = build_gateway(config)
    try:
        assert config.tools.exposure == "auto"
        assert gateway.takes_raw_params is True
    finally:
        await gateway.close()


def test_auto_exposure_does_not_load_the_search_index_at_start():
    probe = (
        "import sys\n"
        "from bastion.compose import build_gateway\n"
        "from bastion.config import GatewayConfig\n"
        "build_gateway(GatewayConfig.model_validate({'servers': {}, 'policy': 'off'}))\n"
        "print(sorted(m for m in ('bastion.search.index', 'numpy', 'bm25s', 'tiktoken') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("extra, shown", [(4, "clients are shown search_tools and call_tool: 11 tools"),
                                          (0, "clients are shown every tool: 7 tools")])
def test_bastion_tools_lists_the_catalog_and_says_what_clients_are_shown(tmp_path, extra, shown):
    run = subprocess.run([BASTION, "tools", str(_config(tmp_path, _extra(extra)))], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    listed = [line.split()[0] for line in run.stdout.splitlines()[1:]]
    assert len(listed) == RAW_TOOLS + extra and "search_tools" not in listed
    assert shown in run.stderr and "tools.exposure = 'auto'" in run.stderr
