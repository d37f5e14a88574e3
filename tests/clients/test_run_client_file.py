"""``bastion run`` on a client's file gives its servers the grants import would: folders listed work as they did."""

from __future__ import annotations

import json
import logging

from bastion.config import load_config
from tests.clients.conftest import FILESYSTEM_SERVER


def client_file(machine, *, policy_off: bool = False):
    documents = machine.home / "Documents"
    data = {"mcpServers": {"files": {"command": str(FILESYSTEM_SERVER), "args": [str(documents), str(machine.home)]}}}
    if policy_off:
        data["policy"] = "off"  # each call of an untrusted server would wait for a person; this test is about files
    return machine.write_json(".config/Claude/claude_desktop_config.json", data)


def test_loading_a_client_file_infers_the_grants_and_logs_the_review(machine, monkeypatch, caplog):
    monkeypatch.setenv("HOME", str(machine.home))
    monkeypatch.setenv("XDG_STATE_HOME", str(machine.state_home))
    with caplog.at_level(logging.INFO, logger="bastion"):
        config = load_config(client_file(machine))
    files = config.servers["files"]
    assert files.sandbox.writable == (str(machine.home / "Documents"),)
    assert files.trust == "untrusted"  # reviewed only when a person reads the review: at import
    logged = [record for record in caplog.records if record.name.startswith("bastion")]
    assert any(record.levelno == logging.INFO and "writes ~/Documents" in record.getMessage() for record in logged)
    assert any(record.levelno == logging.WARNING and "home directory ~ whole" in record.getMessage()
               for record in logged)


def test_an_explicit_sandbox_in_the_client_file_wins(machine, monkeypatch):
    monkeypatch.setenv("HOME", str(machine.home))
    documents = str(machine.home / "Documents")
    path = machine.write_json("client.json", {"mcpServers": {"files": {
        "command": str(FILESYSTEM_SERVER), "args": [documents], "sandbox": {"read_only": [documents]}}}})
    files = load_config(path).servers["files"]
    assert files.sandbox.read_only == (documents,) and files.sandbox.writable == ()


def test_a_filesystem_server_run_from_a_client_file_writes_and_reads_its_listed_folder(machine):
    path = client_file(machine, policy_off=True)
    target = machine.home / "Documents" / "from-the-sandbox.txt"
    wrote = machine.bastion("call", str(path), "files__write_file",
                            "--args", json.dumps({"path": str(target), "content": "written through Bastion\n"}))
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    assert target.read_text() == "written through Bastion\n"  # on the host: the folder was granted writable
    read = machine.bastion("call", str(path), "files__read_text_file",
                           "--args", json.dumps({"path": str(machine.home / "Documents" / "notes.txt")}))
    assert read.returncode == 0, read.stdout + read.stderr
    assert "groceries" in read.stdout
    assert "writes ~/Documents" in wrote.stderr  # the review, in the log


def test_a_memory_server_run_from_a_client_file_keeps_its_memory_in_the_state_folder(machine):
    # In its client the memory server writes beside its own program; in the sandbox that is read-only, so Bastion
    # gives it a file of its own, as import does, and what one run remembers the next one reads.
    memory_server = FILESYSTEM_SERVER.parent / "mcp-server-memory"
    path = machine.write_json("client.json", {"policy": "off", "mcpServers": {"memory": {"command": str(memory_server)}}})
    entity = {"name": "Bastion", "entityType": "gateway", "observations": ["remembers across runs"]}
    created = machine.bastion("call", str(path), "memory__create_entities", "--args", json.dumps({"entities": [entity]}))
    assert created.returncode == 0, created.stdout + created.stderr
    memory_file = machine.state_home / "bastion" / "memory" / "memory.json"
    assert "remembers across runs" in memory_file.read_text()
    read = machine.bastion("call", str(path), "memory__read_graph")
    assert read.returncode == 0, read.stdout + read.stderr
    assert "remembers across runs" in read.stdout


def test_relative_paths_in_a_client_files_arguments_are_read_from_its_folder(machine, monkeypatch, caplog):
    # The sandboxed server runs in /: left relative, ./data/shop.db would be /data/shop.db to it, another file than
    # the one its folder's grant and the review were decided for (and the sandbox bound from Bastion's own folder).
    monkeypatch.setenv("HOME", str(machine.home))
    monkeypatch.setenv("XDG_STATE_HOME", str(machine.state_home))
    folder = machine.home / "projects" / "site"
    (folder / "data").mkdir()
    path = machine.write_json("mcp.json", {"mcpServers": {"shop": {
        "command": "uvx", "args": ["mcp-server-sqlite", "--db-path=./data/shop.db"]}}}, base=folder)
    with caplog.at_level(logging.INFO, logger="bastion"):
        shop = load_config(path).servers["shop"]
    assert shop.args == ["mcp-server-sqlite", f"--db-path={folder}/data/shop.db"]
    assert shop.sandbox.writable == (str(folder / "data"),)
    assert any("server 'shop' reads ~/projects/site/data; writes ~/projects/site/data;" in record.getMessage()
               for record in caplog.records)
