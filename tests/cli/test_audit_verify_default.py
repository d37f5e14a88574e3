"""``bastion audit verify`` with no path verifies the default trail, as the README shows it."""

from __future__ import annotations

import json
import subprocess

from tests.support import BASTION, RawClient, raw_server, write_config


def _verify(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "audit", "verify", *paths], capture_output=True, text=True, timeout=60)


def test_verify_without_a_path_checks_the_default_trail(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # this test's own default trail
    config = write_config(tmp_path / "bastion.json", {"raw": raw_server()}, policy={})
    client = RawClient(config)
    try:
        client.initialize()
        # Whatever the default policy answers, the call is recorded.
        client.request(1, "tools/call", {"name": "raw__echo", "arguments": {"text": "hello"}})
    finally:
        client.close()
    trail = tmp_path / "state" / "bastion" / "audit.jsonl"
    assert trail.exists()

    intact = _verify()
    assert intact.returncode == 0, intact.stderr
    assert "intact" in intact.stderr and str(trail) in intact.stderr

    lines = trail.read_text().splitlines()
    record = json.loads(lines[-1])
    record["tool"] = "tampered"
    lines[-1] = json.dumps(record)
    trail.write_text("\n".join(lines) + "\n")
    tampered = _verify()
    assert tampered.returncode == 1 and "TAMPERED" in tampered.stderr


def test_verify_without_a_path_and_no_default_trail_says_what_to_give(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "nothing-here"))
    missing = _verify()
    assert missing.returncode == 2
    assert "no audit trail at" in missing.stderr and "policy.audit.path" in missing.stderr


def test_verify_with_a_configuration_checks_the_trail_it_writes_with_its_key(tmp_path):
    audit = tmp_path / "trail" / "audit.jsonl"
    key = tmp_path / "audit.key"
    config = write_config(tmp_path / "bastion.json", {"raw": raw_server()},
                          policy={"audit": {"path": str(audit), "key_file": str(key)}})
    client = RawClient(config)
    try:
        client.initialize()
        client.request(1, "tools/list", {})
    finally:
        client.close()
    intact = _verify("--config", str(config))
    assert intact.returncode == 0, intact.stderr
    assert f"the trail of {config}: {audit}" in intact.stderr and "intact" in intact.stderr
    unkeyed = _verify(str(audit))  # without the key the trail was sealed with, it does not verify
    assert unkeyed.returncode != 0
    off = write_config(tmp_path / "off.json", {"raw": raw_server()}, policy="off")
    refused = _verify("--config", str(off))
    assert refused.returncode == 2 and "writes no audit trail" in refused.stderr
