"""Configuration drift end to end: a server's entry (command, args, env names, cwd, url, launcher package) is pinned
with its definitions through ``bastion run``; an entry changed since is held like a rug pull until a person accepts
it with ``bastion pins accept``, while a restart, rotated env values and a reformatted file are not drift."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.config import ServerConfig
from bastion.server_entry import pinned_entry
from tests.support import BASTION, FIXTURES, READY_TIMEOUT, RawClient, pinned_servers

RUG = str(FIXTURES / "rug_pull_server.py")
DEADLINE = 90
TOOLS = {"rug__add", "rug__delete_file", "rug__advance"}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home / "bastion"


def write(tmp_path: Path, entry: dict, indent: int | None = None) -> Path:
    path = tmp_path / "bastion.json"
    path.write_text(json.dumps({"servers": {"rug": {**entry, "trust": "reviewed"}},
                                "guardrails": {"servers": {"rug": {"metadata_injection": "off"}}},
                                "ready_timeout": READY_TIMEOUT}, indent=indent))
    return path


def listed(config: Path) -> tuple[set[str], dict, str]:
    """The tool names a fresh ``bastion run`` lists, its answer to a call of rug__add, and its stderr."""
    client = RawClient(config)
    try:
        client.initialize()
        tools = {t["name"] for t in client.request(1, "tools/list", {}, timeout=DEADLINE)["result"]["tools"]}
        called = client.request(2, "tools/call", {"name": "rug__add", "arguments": {"a": 2, "b": 3}}, timeout=DEADLINE)
    finally:
        _, stderr = client.close()
    return tools, called, stderr


def pins(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BASTION, "pins", *args], capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)


def base() -> dict:
    return {"command": sys.executable, "args": [RUG], "env": {"RUG_STAGE": "0", "API_TOKEN": "first-secret"}}


def test_an_unchanged_entry_rotated_env_values_and_a_reformatted_file_are_not_drift(tmp_path: Path,
                                                                                   state: Path) -> None:
    assert listed(write(tmp_path, base()))[0] == TOOLS
    recorded = pinned_servers(state / "pins.json")["rug"]["entry"]["@entry"]["pinned"]
    assert recorded["env"] == ["API_TOKEN", "RUG_STAGE"] and "first-secret" not in json.dumps(recorded)
    rotated = {**base(), "env": {"API_TOKEN": "rotated-secret", "RUG_STAGE": "0"}}
    rotated["env"] = dict(reversed(list(rotated["env"].items())))  # written in another order
    for config in (write(tmp_path, base()), write(tmp_path, rotated, indent=4)):
        tools, called, stderr = listed(config)
        assert tools == TOOLS and "result" in called, called
        assert "changed-configuration" not in stderr, stderr


@pytest.mark.parametrize("drift", ["new-env-name", "args", "cwd"])
def test_a_changed_entry_holds_every_definition_until_a_person_accepts_it(tmp_path: Path, state: Path,
                                                                          drift: str) -> None:
    assert listed(write(tmp_path, base()))[0] == TOOLS
    changed = base()
    if drift == "new-env-name":
        changed["env"] = {**changed["env"], "PYTHONSTARTUP": str(tmp_path / "payload.py")}
    elif drift == "args":
        changed["args"] = ["-X", "utf8", RUG]
    else:
        changed["cwd"] = str(tmp_path)
    config = write(tmp_path, changed)
    tools, called, stderr = listed(config)
    assert tools == set(), tools  # the definitions are the old entry's: none is served under the new one
    message = called["error"]["message"]
    assert called["error"]["code"] == -32602 and "server's configuration entry changed since it was pinned" in message
    # The commands name the configuration file, so a namesake elsewhere is never the one reviewed or accepted ...
    told = re.findall(r"`bastion pins ([^`]+)`", message)
    assert told == [f"diff rug/@entry --config {config.resolve()}", f"accept rug --config {config.resolve()}"], message
    # ... and the review the message names runs as written.
    review = pins(*shlex.split(told[0]))
    assert review.returncode == 0 and "rug/@entry" in review.stdout, review
    assert called["error"]["data"]["status"] == "changed-configuration"
    assert "guardrail pinning withheld changed-configuration on server rug, configuration entry @entry" in stderr

    assert "accept it with: bastion pins accept rug\n" in pins("diff", "rug/@entry").stdout
    rows = {(row["kind"], row["name"]): row for row in json.loads(pins("diff", "rug", "--json").stdout)}
    assert rows[("configuration entry", "@entry")]["status"] == "changed"
    # Every definition the server offers is listed as withheld with it, saying why.
    held = rows[("tool", "add")]
    assert held["status"] == "withheld" and [r["reason"] for r in held["reasons"]] == ["changed-configuration"]
    assert "the server's configuration entry changed since it was pinned" in held["reasons"][0]["text"]
    assert "secret" not in json.dumps(list(rows.values()))

    accepted = pins("accept", "rug")
    assert accepted.returncode == 0 and "accepted rug/@entry (configuration entry)" in accepted.stdout, accepted
    tools, called, stderr = listed(write(tmp_path, changed))
    assert tools == TOOLS and "result" in called, (called, stderr)


def test_first_definitions_of_a_changed_entry_are_held_not_pinned(tmp_path: Path, state: Path) -> None:
    # The changed entry starts a program offering a tool never seen: not trusted on first use, since it came from
    # the entry nobody has reviewed yet.
    assert listed(write(tmp_path, base()))[0] == TOOLS
    changed = {**base(), "env": {"RUG_STAGE": "1", "API_TOKEN": "x", "EXTRA": "1"}}
    assert listed(write(tmp_path, changed))[0] == set()
    recorded = pinned_servers(state / "pins.json")["rug"]["tools"]
    assert "pinned" not in recorded["multiply"] and "offered" in recorded["multiply"]
    # Put back as it was: the entry matches its pin again, and what the old entry serves is served.
    tools, _, _ = listed(write(tmp_path, base()))
    assert tools == TOOLS


def test_the_pinned_form_of_an_entry() -> None:
    local = ServerConfig.model_validate({"command": " npx ", "args": ["-y", "@scope/server@1.2.3", "--root", "/a"],
                                         "env": {"B": "2", "A": "1"}})
    assert pinned_entry(local) == {"command": "npx", "args": ["-y", "@scope/server@1.2.3", "--root", "/a"],
                                   "env": ["A", "B"], "package": "@scope/server", "version": "1.2.3"}
    other = ServerConfig.model_validate({"command": "npx", "args": ["-y", "@evil/server@1.2.3", "--root", "/a"],
                                         "env": {"A": "1", "B": "2"}})
    assert pinned_entry(other)["package"] == "@evil/server"
    remote = ServerConfig.model_validate({"url": "https://example.test/mcp", "headers": {"X": "secret"}})
    assert pinned_entry(remote) == {"url": "https://example.test/mcp"}


# ------------------------------------------------------------------------------------------ the book, no I/O
def test_a_held_servers_first_definitions_are_offers_until_its_entry_is_accepted() -> None:
    from bastion.guardrails.pin_book import ENTRY_KEY, ENTRY_KIND, PinBook, accept, reconcile

    entry = ("rug", ENTRY_KIND, ENTRY_KEY)
    tool = {"name": "new", "description": "never seen"}
    book, _, _ = reconcile(PinBook(), [(*entry, {"command": "a"})], "t0")  # first use: pinned
    book, _, verdicts = reconcile(book, [(*entry, {"command": "b"})], "t1")
    assert verdicts[0].withheld
    book, seen, _ = reconcile(book, [("rug", "tools", "new", tool)], "t1", frozenset({"rug"}))
    assert [o.action for o in seen] == ["offer"] and book.get("rug", "tools", "new").pinned is None
    again, seen, _ = reconcile(book, [("rug", "tools", "new", tool)], "t2", frozenset({"rug"}))
    assert seen == [] and again == book  # steady while held: nothing written again
    # Accepting the entry alone: its server is no longer held, and the offer is then pinned as first seen.
    book, accepted = accept(book, "rug", ENTRY_KEY, "t3")
    assert accepted == [entry]
    book, seen, verdicts = reconcile(book, [("rug", "tools", "new", tool)], "t4")
    assert book.get("rug", "tools", "new").pinned == tool and not verdicts[0].withheld


def test_a_pins_file_from_before_entries_pins_the_entry_on_first_use() -> None:
    from bastion.guardrails.pin_book import ENTRY_KEY, ENTRY_KIND, PinBook, PinRecord, reconcile

    old = PinBook({("rug", "tools", "add"): PinRecord(pinned={"name": "add"}, pinned_at="t0")})
    book, seen, verdicts = reconcile(old, [("rug", ENTRY_KIND, ENTRY_KEY, {"command": "a"})], "t1")
    assert [o.action for o in seen] == ["pin"] and not verdicts[0].withheld
