"""``bastion keys create|list|revoke`` as a user runs them: the key on stdout once, never again."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bastion.auth.api_keys import ApiKeyFile, digest
from tests.support import BASTION


def keys(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([BASTION, "keys", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_create_prints_the_key_once_and_list_never_shows_it(tmp_path) -> None:
    file = str(tmp_path / "keys.json")
    made = keys("create", "ci", "--scope", "mcp:read mcp:tools", "--scope", "extra", "--groups", "ops,ci",
                "--expires", "30d", "--file", file)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert made.stdout == key + "\n" and key.startswith("bst_")  # the output is the key and nothing else
    assert key not in made.stderr and "only time" in made.stderr
    listed = keys("list", "--json", "--file", file)
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["scopes"], r["groups"], r["expired"]) for r in rows] == [
        ("ci", ["mcp:read", "mcp:tools", "extra"], ["ops", "ci"], False)]
    assert rows[0]["expires"] > rows[0]["created"]
    table = keys("list", "--file", file)
    assert "ci" in table.stdout and "mcp:read mcp:tools extra" in table.stdout
    for output in (listed.stdout, table.stdout, table.stderr):
        assert key not in output and key[4:20] not in output
    assert ApiKeyFile(Path(file)).load()[0]["ci"].digest == digest(key)


def test_revoke_and_its_mistakes(tmp_path) -> None:
    file = str(tmp_path / "keys.json")
    keys("create", "ci", "--file", file)
    again = keys("create", "ci", "--file", file)
    assert again.returncode == 2 and "exists already" in again.stderr and again.stdout == ""
    missing = keys("revoke", "nobody", "--file", file)
    assert missing.returncode == 2 and "keys: ci" in missing.stderr
    gone = keys("revoke", "ci", "--file", file)
    assert gone.returncode == 0 and "revoked 'ci'" in gone.stderr
    assert json.loads(keys("list", "--json", "--file", file).stdout) == []
    bad = keys("create", "x", "--expires", "yesterday", "--file", file)
    assert bad.returncode == 2 and "--expires" in bad.stderr and bad.stdout == ""


def test_the_configuration_names_the_file_relative_to_itself(tmp_path) -> None:
    config = tmp_path / "conf" / "bastion.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"servers": {}, "auth": {"api_keys": "secrets/keys.json"}}))
    made = keys("create", "ci", "--config", str(config), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert ApiKeyFile(tmp_path / "conf" / "secrets" / "keys.json").load()[0]["ci"].digest == digest(made.stdout.strip())
    unset = tmp_path / "plain.json"
    unset.write_text(json.dumps({"servers": {}}))
    refused = keys("list", "--config", str(unset))
    assert refused.returncode == 2 and "auth.api_keys is not set" in refused.stderr


def test_the_default_file_is_in_the_state_directory(tmp_path) -> None:
    import os

    made = subprocess.run([BASTION, "keys", "create", "ci"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    assert made.returncode == 0, made.stderr
    assert ApiKeyFile(tmp_path / "bastion" / "api_keys.json").load()[0]["ci"].digest == digest(made.stdout.strip())
