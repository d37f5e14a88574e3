"""Configuration and client files of any shape are refused with a sentence naming the file and the key, never with
an exception from inside the loader. Each case here was found by tests/fuzz/fuzz_config.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bastion.clients.discovery import FoundServer, read_client_file
from bastion.clients.importer import convert_entry
from bastion.config import ConfigError, load_config

DEEP = 100_000  # far past Python's recursion limit: json and tomllib read nesting by recursion


@pytest.mark.parametrize(("name", "text", "said"), [
    ("bastion.json", b"[" * DEEP, "nested too deeply"),
    ("bastion.toml", b"a = " + b"[" * DEEP, "nested too deeply"),
    ("bastion.toml", b"a = " + b"{x = " * 3000, "nested too deeply"),
    ("bastion.json", b"1" * 5000, "4300 digits"),  # past Python's limit on integer digits: a ValueError
])
def test_a_file_nested_too_deeply_or_with_a_huge_integer_is_a_config_error(tmp_path: Path, name: str, text: bytes,
                                                                           said: str) -> None:
    path = tmp_path / name
    path.write_bytes(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path}: not valid ") and said in str(refused.value)


@pytest.mark.parametrize("entry", [
    {"command": "node", "sandbox": [1]},  # grant inference took dict(sandbox)
    {"command": "node", "args": 5},  # and iterated args
    {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": 5},  # MEMORY_FILE_PATH in env
    {"command": "node", "type": {"a": 1}},  # a set looked the type up: unhashable
    {"url": "https://example.com/mcp", "type": ["http"]},
])
def test_a_client_entry_of_the_wrong_shape_is_a_config_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        entry: dict) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": {"fs": entry}}))
    try:
        load_config(path)
    except ConfigError as refused:
        assert str(refused).startswith(f"{path}: ") and "fs" in str(refused)


def test_a_client_file_nested_too_deeply_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(b"[" * DEEP)
    assert read_client_file(path, "client", tmp_path).problems == [f"{path}: not valid JSON: nested too deeply"]


@pytest.mark.parametrize("args", [1.5, 7, True, {"a": 1}])
def test_an_entry_whose_args_are_not_a_list_is_skipped_with_a_reason(tmp_path: Path, args: object) -> None:
    found = FoundServer("fs", {"command": "node", "args": args}, "client", tmp_path / "c.json", tmp_path)
    assert convert_entry(found, home=tmp_path, environ={}) == "'fs' from client: args is not a list; skipped"
