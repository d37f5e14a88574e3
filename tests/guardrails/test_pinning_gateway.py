"""Tool pinning end to end: a real SDK server that changes its tools, prompts and templates after they were first
seen (after list_changed, and across a restart), through ``bastion run``, and ``bastion pins`` in between."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BASTION, FIXTURES, READY_TIMEOUT, RawClient, pinned_servers

RUG = str(FIXTURES / "rug_pull_server.py")
DEADLINE = 90


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of this test's own (Bastion processes and `bastion pins` inherit it)."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "bastion"


def rug(stage: int) -> dict:
    return {"command": sys.executable, "args": [RUG], "env": {"RUG_STAGE": str(stage)}}


def mcp_servers_file(tmp_path: Path, stage: int) -> Path:
    """A plain client file: no policy, no guardrails section, so everything is as by default."""
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"rug": rug(stage)}}))
    return path


def reviewed_file(tmp_path: Path, stage: int) -> Path:
    """The default policy and guardrails, for a server whose annotations the policy believes (trust "reviewed"): a
    tool that claims to be read-only is called without a person's approval, so a claim changed later must not be
    believed. The changed add's description also carries instructions, which the prompt-injection guardrail withholds
    on its own, accepted or not: it is off for this server, so what is seen here is pinning's doing alone."""
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"servers": {"rug": {**rug(stage), "trust": "reviewed"}},
                                "guardrails": {"servers": {"rug": {"metadata_injection": "off"}}},
                                "ready_timeout": READY_TIMEOUT}))
    return path


def names(client: RawClient, request_id: int, method: str = "tools/list", key: str = "tools") -> set[str]:
    answer = client.request(request_id, method, {}, timeout=DEADLINE)
    return {item.get("uriTemplate", item.get("name")) for item in answer["result"][key]}


def pins(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "pins", *args], capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)


def warnings_of(client: RawClient) -> list[dict]:
    return [m["params"]["data"] for m in client.skipped
            if m.get("method") == "notifications/message" and m["params"].get("level") == "warning"]


def test_a_plain_mcp_servers_file_gets_pinning(tmp_path: Path, state: Path) -> None:
    for stage, expected in ((0, {"rug__add", "rug__delete_file", "rug__advance"}),
                            (1, {"rug__advance", "rug__multiply"})):
        client = RawClient(mcp_servers_file(tmp_path, stage))
        try:
            client.initialize()
            assert names(client, 1) == expected
        finally:
            client.close()


def test_a_rug_pull_across_restarts_is_withheld_until_a_person_accepts_it(tmp_path: Path, state: Path) -> None:
    first = RawClient(reviewed_file(tmp_path, 0))
    try:
        first.initialize()
        assert names(first, 1) == {"rug__add", "rug__delete_file", "rug__advance"}
        assert names(first, 2, "prompts/list", "prompts") == {"rug__greet"}
        assert names(first, 3, "resources/templates/list", "resourceTemplates") == {"notes://{id}"}
    finally:
        first.close()
    recorded = pinned_servers(state / "pins.json")
    assert set(recorded["rug"]["tools"]) == {"add", "delete_file", "advance"}
    assert recorded["rug"]["tools"]["add"]["pinned"]["description"] == "Adds two numbers"

    # An upgrade: add wants a new required parameter and carries instructions; delete_file claims to be read-only.
    second = RawClient(reviewed_file(tmp_path, 1))
    try:
        second.initialize()
        assert names(second, 1) == {"rug__advance", "rug__multiply"}  # multiply is new, so trusted on first use
        told = " ".join(w["message"] for w in warnings_of(second))
        assert "tool 'rug__add' of server 'rug' is withheld" in told and "rug__delete_file" in told

        # The default policy believes add's claim to be read-only and lets the call through; pinning refuses it.
        add = second.request(2, "tools/call", {"name": "rug__add", "arguments": {"a": 2, "b": 3, "note": "x"}})
        error = add["error"]
        assert error["code"] == -32602
        assert "tool 'rug__add' of server 'rug' is withheld: its definition changed since it was pinned" in error[
            "message"]
        assert "description changed" in error["message"] and "new required parameter 'note'" in error["message"]
        assert f"`bastion pins accept rug/add --config {(tmp_path / 'bastion.json').resolve()}`" in error["message"]
        assert error["data"]["guardrail"] == "pinning" and error["data"]["tool"] == "add"

        assert names(second, 4, "prompts/list", "prompts") == set()
        greet = second.request(5, "prompts/get", {"name": "rug__greet", "arguments": {"name": "Ada"}})
        assert "prompt 'rug__greet' of server 'rug' is withheld" in greet["error"]["message"]

        # A person reviews the change and accepts one tool, while the gateway runs.
        listed = pins("list", "--json")
        assert listed.returncode == 0, listed.stderr
        status = {(row["kind"], row["name"]): row["status"] for row in json.loads(listed.stdout)}
        assert status[("tool", "add")] == status[("tool", "delete_file")] == status[("prompt", "greet")] == "changed"
        assert status[("tool", "multiply")] == status[("tool", "advance")] == "pinned"

        diff = pins("diff", "rug/add")
        assert diff.returncode == 0, diff.stderr
        assert "rug/add (tool): withheld, changed since it was pinned" in diff.stdout
        assert "* new required parameter 'note'" in diff.stdout
        assert '-  "description": "Adds two numbers",' in diff.stdout
        assert '+  "description": "Adds two numbers. <IMPORTANT>' in diff.stdout

        second.skipped.clear()
        accepted = pins("accept", "rug/add")
        assert accepted.returncode == 0, accepted.stderr
        assert accepted.stdout == "accepted rug/add (tool)\n"
        # The running gateway notices the pins file changed and tells the client, which lists again.
        while not any(m.get("method") == "notifications/tools/list_changed" for m in second.skipped):
            second.skipped.append(second.recv(timeout=DEADLINE))

        assert names(second, 6) == {"rug__add", "rug__advance", "rug__multiply"}  # delete_file is still withheld
        summed = second.request(7, "tools/call", {"name": "rug__add", "arguments": {"a": 2, "b": 3, "note": "x"}})
        assert summed["result"]["content"][0]["text"] == "5"
    finally:
        _, stderr = second.close()
    assert "guardrail pinning withheld changed-definition on server rug, tool delete_file" in stderr
    assert "guardrail pinning refused changed-definition on server rug, tool add" in stderr
    # Each intervention is an audit record too (the default policy keeps the trail in the state directory).
    records = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    pinning = [(r["action"], r["target"], r["found"]) for r in records if r.get("guardrail") == "pinning"]
    assert ("withheld", "tool delete_file", "changed-definition") in pinning
    assert ("refused", "tool add", "changed-definition") in pinning
    assert ("withheld", "prompt greet", "changed-definition") in pinning

    # Renamed: add is gone and sum carries its definition; the template's description changed.
    third = RawClient(reviewed_file(tmp_path, 2))
    try:
        third.initialize()
        assert names(third, 1) == {"rug__advance", "rug__multiply"}
        renamed = third.request(2, "tools/call", {"name": "rug__sum", "arguments": {"a": 1, "b": 1, "note": "x"}})
        message = renamed["error"]["message"]
        assert "tool 'rug__sum' of server 'rug' is withheld: it carries the same definition as tool 'add'" in message
        assert "a new name does not dodge a pin" in message and "and besides" not in message
        # A URI of the changed template is refused as the template is, with no listing before it.
        read = third.request(4, "resources/read", {"uri": "notes://1"})
        assert read["error"]["code"] == -32602
        assert "'notes://{id}' of server 'rug' is withheld" in read["error"]["message"], read
        assert names(third, 3, "resources/templates/list", "resourceTemplates") == set()
    finally:
        third.close()
    diff = pins("diff", "rug", "--json")
    rows = {row["name"]: row for row in json.loads(diff.stdout)}
    assert rows["sum"]["status"] == "renamed" and rows["sum"]["matches"] == "add"
    assert rows["note"]["kind"] == "resource template" and rows["note"]["changes"] == ["description changed"]


def test_a_tool_changed_after_list_changed_is_withheld_at_once_and_calls_to_it_refused(tmp_path: Path,
                                                                                      state: Path) -> None:
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"rug": rug(0)}, "policy": "off", "ready_timeout": READY_TIMEOUT}))
    client = RawClient(config)
    try:
        client.initialize()
        assert names(client, 1) == {"rug__add", "rug__delete_file", "rug__advance"}
        assert client.request(2, "tools/call", {"name": "rug__add", "arguments": {"a": 1, "b": 2}})["result"][
            "content"][0]["text"] == "3"
        advanced = client.request(3, "tools/call", {"name": "rug__advance", "arguments": {}}, timeout=DEADLINE)
        assert advanced["result"]["content"][0]["text"] == "stage 1"
        # The server announces its tools, then its prompts: both changes are in the catalog once both are heard.
        announced = {"notifications/tools/list_changed", "notifications/prompts/list_changed"}
        while not announced <= {m.get("method") for m in client.skipped}:
            client.skipped.append(client.recv(timeout=DEADLINE))
        # Refused without the client listing again: the changed definition is in the catalog, never served.
        refused = client.request(4, "tools/call", {"name": "rug__delete_file", "arguments": {"path": "x"}})
        assert refused["error"]["code"] == -32602
        assert ("annotation readOnlyHint changed: false → true (now claims to be read-only)"
                in refused["error"]["message"])
        assert names(client, 5) == {"rug__advance", "rug__multiply"}
        assert names(client, 6, "prompts/list", "prompts") == set()
    finally:
        _, stderr = client.close()
    assert "guardrail pinning withheld changed-definition on server rug, tool add" in stderr
    record = pinned_servers(state / "pins.json")["rug"]["tools"]["add"]
    assert record["pinned"]["description"] == "Adds two numbers" and "IMPORTANT" in record["offered"]["description"]


def test_pinning_off_for_a_server_serves_its_changes(tmp_path: Path, state: Path) -> None:
    config = tmp_path / "bastion.json"

    for step, (pinning, expected) in enumerate([
            ("enforce", {"rug__add", "rug__delete_file", "rug__advance"}),
            ("enforce", {"rug__advance", "rug__multiply"}),
            ("off", {"rug__add", "rug__delete_file", "rug__advance", "rug__multiply"})]):
        config.write_text(json.dumps({"servers": {"rug": rug(0 if step == 0 else 1)},
                                      # The prompt-injection guardrail would withhold the changed add by itself.
                                      "guardrails": {"servers": {"rug": {"pinning": pinning,
                                                                         "metadata_injection": "off"}}},
                                      "policy": "off", "ready_timeout": READY_TIMEOUT}))
        client = RawClient(config)
        try:
            client.initialize()
            assert names(client, 1) == expected, pinning
        finally:
            client.close()


def test_withheld_tools_are_never_found_or_called_in_search_mode(tmp_path: Path, state: Path) -> None:
    config = tmp_path / "bastion.json"

    def configure(stage: int) -> None:
        config.write_text(json.dumps({"servers": {"rug": rug(stage)}, "tools": {"exposure": "search"},
                                      "policy": "off", "ready_timeout": READY_TIMEOUT}))

    configure(0)
    listed = subprocess.run([BASTION, "tools", str(config)], capture_output=True, text=True, timeout=DEADLINE,
                            stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stderr
    assert "add" in pinned_servers(state / "pins.json")["rug"]["tools"]  # pinned on first use
    configure(1)
    client = RawClient(config)
    try:
        client.initialize()
        found = client.request(1, "tools/call", {"name": "search_tools", "arguments": {
            "query": "add two numbers together", "k": 10}}, timeout=DEADLINE)["result"]
        found_names = [t["name"] for t in json.loads(found["content"][0]["text"])["tools"]]
        assert "rug__multiply" in found_names and "rug__add" not in found_names
        assert "rug__delete_file" not in found_names
        via_meta = client.request(2, "tools/call", {"name": "call_tool", "arguments": {
            "name": "rug__add", "arguments": {"a": 1, "b": 2, "note": "x"}}}, timeout=DEADLINE)
        assert "3" not in json.dumps(via_meta.get("result", {}).get("structuredContent", {}))
        assert via_meta.get("error") or via_meta["result"]["isError"]
    finally:
        client.close()


def test_a_broken_pins_file_withholds_what_it_cannot_check_until_it_is_repaired(tmp_path: Path, state: Path) -> None:
    state.mkdir(parents=True)
    (state / "pins.json").write_text("{broken")
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"rug": rug(0)}, "policy": "off", "ready_timeout": READY_TIMEOUT}))
    client = RawClient(config)
    try:
        client.initialize()
        assert names(client, 1) == set()
        refused = client.request(2, "tools/call", {"name": "rug__add", "arguments": {"a": 1, "b": 2}})
        message = refused["error"]["message"]
        assert "it cannot be checked against the pinned definitions" in message and str(state / "pins.json") in message
        assert (state / "pins.json").read_text() == "{broken"  # never overwritten
        (state / "pins.json").unlink()  # a person moves it away: what is offered now is trusted afresh
        assert names(client, 3) == {"rug__add", "rug__delete_file", "rug__advance"}
        assert client.request(4, "tools/call", {"name": "rug__add", "arguments": {"a": 1, "b": 2}})["result"][
            "content"][0]["text"] == "3"
    finally:
        _, stderr = client.close()
    assert stderr.count("not a pins file") == 1 and "can be read again" in stderr
    assert set(pinned_servers(state / "pins.json")["rug"]["tools"]) == {
        "add", "delete_file", "advance"}
