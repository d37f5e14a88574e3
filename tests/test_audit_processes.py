"""Two clients on one audit trail: real ``bastion run`` and ``bastion call`` processes on one configuration.

Each process writes a chain of its own beside the configured trail; ``bastion audit verify`` on the
configured path checks every chain, counts every record, and still finds tampering with any of them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import BASTION, RawClient, raw_server

PERMIT_ALL = '@id("everything") permit (principal, action, resource);\n'
CALLS = 6


@pytest.fixture()
def configured(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "all.cedar").write_text(PERMIT_ALL)
    audit = tmp_path / "trail" / "audit.jsonl"
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"raw": raw_server()},
        "ready_timeout": 120,  # the calls below want the raw server in the catalog from the first answer
        "policy": {"policy_files": ["all.cedar"], "audit": {"path": str(audit)}},
    }))
    return config, audit


def verify(audit: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "audit", "verify", *options, str(audit)], capture_output=True, text=True, timeout=120)


def tool_calls(chain: dict) -> int:
    """The tools/call requests a chain recorded (one ``call`` record each)."""
    count = 0
    for name in chain["files"]:
        for line in Path(name).read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "call" and record["what"]["method"] == "tools/call":
                count += 1
    return count


def echo(client: RawClient, request_id: int, text: str) -> None:
    answer = client.request(request_id, "tools/call", {"name": "raw__echo", "arguments": {"text": text}}, timeout=60)
    assert answer["result"]["content"][0]["text"] == text, answer


def test_two_clients_at_once_each_write_a_chain_that_verifies(configured: tuple[Path, Path]) -> None:
    config, audit = configured
    clients = [RawClient(config), RawClient(config)]
    try:
        for client in clients:
            client.initialize()
        for i in range(CALLS):  # interleaved: both processes are writing the trail at the same time
            for n, client in enumerate(clients):
                echo(client, 10 + i, f"client{n}-call{i}")
    finally:
        outcomes = [client.close() for client in clients]
    assert all(code == 0 for code, _ in outcomes), outcomes

    done = verify(audit, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "intact" and report["problems"] == []
    chains = [chain for chain in report["chains"] if chain["role"] != "registry"]
    assert [chain["file"] for chain in chains] == [str(audit), str(audit.with_name("audit.chain-1.jsonl"))]
    assert all(chain["status"] == "intact" and chain["notes"] == [] for chain in chains)  # both shut down cleanly
    assert [tool_calls(chain) for chain in chains] == [CALLS, CALLS]
    assert report["records"] == sum(chain["records"] for chain in chains) > 2 * CALLS
    assert [chain["role"] for chain in report["chains"]].count("registry") == 1

    people = verify(audit)
    assert people.returncode == 0 and people.stdout == ""
    assert people.stderr.splitlines()[-1] == f"all: {report['records']} records in 2 chain(s): intact"

    # Tampering with either process's chain is still found, and the chain is named.
    second = audit.with_name("audit.chain-1.jsonl")
    lines = second.read_text().splitlines()
    lines[2] = lines[2].replace('"tools/call"', '"tools/list"')
    second.write_text("\n".join(lines) + "\n")
    tampered = verify(audit)
    assert tampered.returncode == 1 and "TAMPERED" in tampered.stderr and str(second) in tampered.stderr
    main_lines = audit.read_text().splitlines()
    del main_lines[3]
    audit.write_text("\n".join(main_lines) + "\n")
    report = json.loads(verify(audit, "--json").stdout)
    assert [chain["status"] for chain in report["chains"]] == ["tampered", "tampered", "intact"]


def test_bastion_call_beside_a_running_gateway(configured: tuple[Path, Path]) -> None:
    config, audit = configured
    client = RawClient(config)
    try:
        client.initialize()
        echo(client, 1, "before")
        beside = subprocess.run([BASTION, "call", str(config), "raw__echo", "--args", '{"text": "beside"}'],
                                capture_output=True, text=True, timeout=180)
        assert beside.returncode == 0, beside.stderr
        assert json.loads(beside.stdout)["content"][0]["text"] == "beside"
        echo(client, 2, "after")
        running = json.loads(verify(audit, "--json").stdout)  # while the gateway still runs
        assert running["status"] == "intact", running
        assert running["chains"][0]["writing"] is True and running["chains"][1]["writing"] is False
    finally:
        code, stderr = client.close()
    assert code == 0, stderr

    done = verify(audit, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    main, beside_chain, registry = report["chains"]
    assert (main["file"], beside_chain["file"]) == (str(audit), str(audit.with_name("audit.chain-1.jsonl")))
    assert (tool_calls(main), tool_calls(beside_chain)) == (2, 1)
    assert registry["role"] == "registry" and registry["records"] == 1

    # A whole chain deleted is found through the registry.
    for name in beside_chain["files"]:
        Path(name).unlink()
    gone = verify(audit)
    assert gone.returncode == 1 and "audit.chain-1.jsonl" in gone.stderr and "deleted" in gone.stderr
