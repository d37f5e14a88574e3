"""The policy section of a configuration, enforced by ``bastion run`` on a real client and server."""

from __future__ import annotations

import json
import subprocess

from tests.support import BASTION, READY_TIMEOUT, RawClient, raw_server

POLICY = """
@id("list-everything")
permit (principal, action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources",
                              Bastion::Action::"list_prompts"], resource);

@id("devs-call-raw")
permit (principal in Bastion::Group::"dev", action == Bastion::Action::"call_tool", resource in Bastion::Server::"raw");

@id("never-crash")
forbid (principal, action == Bastion::Action::"call_tool", resource)
when { resource.name == "crash" };
"""


def _config(tmp_path, identity_groups):
    (tmp_path / "team.cedar").write_text(POLICY)
    audit = tmp_path / "audit.jsonl"
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server()},
        "ready_timeout": READY_TIMEOUT,
        "policy": {
            "policy_files": ["team.cedar"],  # relative to the configuration file
            "identity": {"name": "alice", "groups": identity_groups},
            "guards": [{"kind": "shell", "tool": "raw/echo", "argument": "text", "mode": "argument"}],
            "audit": {"path": str(audit)},
        },
    }))
    return config, audit


def test_policy_hides_denies_guards_and_audits(tmp_path):
    config, audit = _config(tmp_path, ["dev"])
    client = RawClient(config)
    try:
        client.initialize()
        names = {t["name"] for t in client.request(1, "tools/list", {})["result"]["tools"]}
        assert "raw__echo" in names and "raw__crash" not in names  # a tool one may not call is hidden

        denied = client.request(2, "tools/call", {"name": "raw__crash", "arguments": {}})
        assert "error" in denied and "never-crash" in json.dumps(denied["error"])

        refused = client.request(3, "tools/call", {"name": "raw__echo", "arguments": {"text": "x; rm -rf /"}})
        assert "error" in refused or refused["result"].get("isError")

        allowed = client.request(4, "tools/call", {"name": "raw__echo", "arguments": {"text": "hello.world"}})
        assert allowed["result"]["content"][0]["text"] == "hello.world"
    finally:
        client.close()
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert any(r.get("decision") == "deny" for r in records)
    verified = subprocess.run([BASTION, "audit", "verify", str(audit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    lines = audit.read_text().splitlines()
    lines[1] = lines[1].replace("alice", "mallory")
    audit.write_text("\n".join(lines) + "\n")
    tampered = subprocess.run([BASTION, "audit", "verify", str(audit)], capture_output=True, text=True, timeout=60)
    assert tampered.returncode != 0


def test_a_principal_outside_the_group_sees_and_calls_nothing(tmp_path):
    config, _ = _config(tmp_path, ["guest"])
    client = RawClient(config)
    try:
        client.initialize()
        assert client.request(1, "tools/list", {})["result"]["tools"] == []
        answer = client.request(2, "tools/call", {"name": "raw__echo", "arguments": {"text": "hi"}})
        assert "error" in answer
    finally:
        client.close()


def _undeclared_config(tmp_path, **policy):
    """The raw server (untrusted, the default) with every tools/call it receives marked; ``policy`` overrides."""
    (tmp_path / "team.cedar").write_text(POLICY)
    marks = tmp_path / "marks"
    server = raw_server(marks)
    server["env"]["RAW_SERVER_MARK_CALLS"] = "1"
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": server},
        "ready_timeout": READY_TIMEOUT,
        "policy": {"policy_files": ["team.cedar"], "identity": {"name": "alice", "groups": ["dev"]},
                   "audit": {"path": str(tmp_path / "audit.jsonl")}, **policy},
    }))
    return config, marks


def _calls(marks):
    return [line for line in marks.read_text().splitlines() if line.startswith("call ")] if marks.exists() else []


def test_an_undeclared_argument_to_an_untrusted_server_never_reaches_it(tmp_path):
    config, marks = _undeclared_config(tmp_path)
    client = RawClient(config)
    try:
        client.initialize()
        refused = client.request(1, "tools/call", {"name": "raw__echo", "arguments": {"text": "hi", "stash": "s3cr3t"}})
        assert refused["error"]["code"] == -32602
        assert refused["error"]["data"]["rule"] == "undeclared_arguments"
        assert "'/stash'" in refused["error"]["message"] and "policy.undeclared_arguments" in refused["error"]["message"]
        assert _calls(marks) == []
        allowed = client.request(2, "tools/call", {"name": "raw__echo", "arguments": {"text": "hi"}})
        assert allowed["result"]["content"][0]["text"] == "hi"
        assert len(_calls(marks)) == 1 and "stash" not in _calls(marks)[0]
    finally:
        client.close()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert any(r.get("decision") == "deny" and "undeclared_arguments" in json.dumps(r) for r in records)


def test_undeclared_arguments_allow_lets_the_extra_key_through(tmp_path):
    config, marks = _undeclared_config(tmp_path, undeclared_arguments="allow")
    client = RawClient(config)
    try:
        client.initialize()
        answer = client.request(1, "tools/call", {"name": "raw__echo", "arguments": {"text": "hi", "stash": "s"}})
        assert answer["result"]["content"][0]["text"] == "hi"
        assert len(_calls(marks)) == 1
    finally:
        client.close()
