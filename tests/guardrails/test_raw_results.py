"""A call's result passed on as the server's bytes with every guardrail on: when no guardrail changes anything and
every JSON reader reads the bytes as Bastion decoded them. A result with a key twice, whose first value a client
might read though Bastion scanned the last, is re-encoded from what was scanned instead."""

from __future__ import annotations

import json
import random
import string

import pytest

from bastion.guardrails.raw import reads_alike
from tests.support import READY_TIMEOUT, RawClient, raw_server

_PICK = random.Random(7)
TOKEN = "ghp_" + "".join(_PICK.choice(string.ascii_letters + string.digits) for _ in range(36))


def test_bytes_read_alike_unless_a_key_is_there_twice_or_an_escape_could_hide_one() -> None:
    plain = b'{ "content" : [{"type": "text", "text": "a: b, c:d"}], "n": 1 }'
    assert reads_alike(plain, json.loads(plain))
    twice = b'{"content": [{"type": "text", "text": "secret: x", "text": "fine"}]}'
    assert not reads_alike(twice, json.loads(twice))
    # The dropped member's value held an object of its own: still told apart.
    nested = b'{"a": {"b": 1, "c": 2}, "a": {"b": 1}}'
    assert not reads_alike(nested, json.loads(nested))
    escaped = b'{"te\\u0078t": "x"}'
    assert not reads_alike(escaped, json.loads(escaped))
    assert reads_alike(b'{"k": "a \\"quoted\\" \\\\ path\\nline"}', json.loads(b'{"k": "a \\"quoted\\" \\\\ path\\nline"}'))


@pytest.fixture
def verbatim(tmp_path):
    """``bastion run`` with the guardrails as they come (the policy off) in front of a server whose echo writes its
    text as the result's JSON, byte for byte."""
    server = raw_server(tmp_path / "marks")
    server["env"]["RAW_SERVER_ECHO_VERBATIM"] = "1"
    config = tmp_path / "bastion.json"
    # The secrets reach the server in the echo's arguments: argument_secrets would hold those calls, and what is tested
    # here is what is done with the server's answer.
    config.write_text(json.dumps({"servers": {"raw": server}, "policy": "off", "ready_timeout": READY_TIMEOUT,
                                  "tools": {"exposure": "all"}, "guardrails": {"argument_secrets": "off"}}))
    client = RawClient(config)
    client.initialize()
    yield client
    client.close()


def answer_line(client: RawClient, rid: str, result: str) -> bytes:
    client.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                 "params": {"name": "raw__echo", "arguments": {"text": result}}})
    return client.recv_line()


def test_a_clean_result_reaches_the_client_as_the_bytes_its_server_sent(verbatim) -> None:
    # Spacing and an integer wider than 64 bits: neither would survive a decode and re-encode.
    result = '{ "n" : 123456789012345678901234567890, "content": [{"type": "text", "text": "all: quiet"}] }'
    line = answer_line(verbatim, "c-1", result)
    assert line == b'{"jsonrpc":"2.0","id":"c-1","result":' + result.encode() + b"}"


def test_a_result_with_a_secret_is_redacted_not_passed_on(verbatim) -> None:
    line = answer_line(verbatim, "c-2", json.dumps({"content": [{"type": "text", "text": f"token {TOKEN} end"}]}))
    assert TOKEN.encode() not in line
    assert json.loads(line)["result"]["content"][0]["text"] == "token [redacted: github-pat] end"


def test_a_key_twice_is_re_encoded_from_what_was_scanned(verbatim) -> None:
    # Bastion reads the last "text"; a client reading the first would see the token nobody scanned.
    result = '{"content": [{"type": "text", "text": "token ' + TOKEN + ' end", "text": "fine"}]}'
    line = answer_line(verbatim, "c-3", result)
    assert TOKEN.encode() not in line
    assert json.loads(line)["result"] == {"content": [{"type": "text", "text": "fine"}]}


def test_a_link_to_another_servers_resource_is_still_found_behind_an_escape(verbatim) -> None:
    # Deputy's byte search for resource links cannot be dodged by spelling the type with an escape: the result is
    # decoded and read (this one's link points at no server's resource, so it stays).
    result = '{"content": [{"type": "resource\\u005flink", "uri": "file:///nobody", "name": "n"}]}'
    line = answer_line(verbatim, "c-4", result)
    assert json.loads(line)["result"]["content"][0]["type"] == "resource_link"
    assert b"\\u005f" not in line  # re-encoded, not passed on: an escape stops the bytes from passing
