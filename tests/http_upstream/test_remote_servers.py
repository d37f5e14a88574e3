"""Remote (HTTP) servers federated beside a local one through ``bastion run``: the official SDK's server over
Streamable HTTP in both eras and over the old HTTP+SSE transport, and FastMCP over HTTP, each on 127.0.0.1.

A stdio client lists and calls tools, reads a resource, gets a prompt, sees a remote call's progress and a remote
list_changed, and calls the local server in the same session.
"""

from __future__ import annotations

import json

import pytest

from tests.support import RawClient, raw_server, wait_for, write_config

# (server arguments, the entry's era and transport): each remote form a configuration can name.
SDK_FORMS = {
    "streamable-http-modern": ((), {"era": "modern"}),
    "streamable-http-legacy": ((), {"era": "legacy"}),
    "streamable-http-legacy-json": (("--json-response",), {"era": "legacy"}),
    "streamable-http-auto": ((), {}),
    "sse": (("--transport", "sse"), {"transport": "sse"}),
    "sse-found-by-auto": (("--transport", "sse"), {}),
}


def _text(answer: dict) -> str:
    assert "result" in answer, answer
    return answer["result"]["content"][0]["text"]


def _federate(tmp_path, url: str, **entry) -> RawClient:
    # The remote is untrusted: taint would send the local server's calls after it to a person nobody plays here.
    config = write_config(tmp_path / "bastion.json", {"remote": {"url": url, **entry}, "local": raw_server()},
                          guardrails={"taint": "off"})
    client = RawClient(config)
    client.initialize()
    return client


@pytest.mark.parametrize("form", list(SDK_FORMS))
def test_an_sdk_server_over_http_is_federated_beside_a_local_one(tmp_path, remote_server, form):
    args, entry = SDK_FORMS[form]
    server = remote_server(*args)
    client = _federate(tmp_path, server.url, **entry)
    try:
        names = {tool["name"] for tool in client.request(1, "tools/list", {}, timeout=120)["result"]["tools"]}
        assert {"remote__echo", "remote__slow", "remote__grow", "local__echo"} <= names
        assert _text(client.request(2, "tools/call", {"name": "remote__echo", "arguments": {"text": "hi"}})) == \
            "echo: hi"
        assert "result" in client.request(3, "tools/call", {"name": "local__echo", "arguments": {"text": "x"}})

        resources = client.request(4, "resources/list", {})["result"]["resources"]
        uri = next(r["uri"] for r in resources if r["uri"].endswith("note://hello") or "hello" in r["uri"])
        read = client.request(5, "resources/read", {"uri": uri})["result"]
        assert read["contents"][0]["text"] == "hello from the remote"
        prompt = client.request(6, "prompts/get", {"name": "remote__greet", "arguments": {"name": "Ada"}})
        assert "Hello, Ada!" in json.dumps(prompt["result"])

        client.skipped.clear()
        slow = client.request(7, "tools/call", {"name": "remote__slow", "arguments": {"seconds": 0.2},
                                                "_meta": {"progressToken": "p1"}}, timeout=60)
        assert _text(slow) == "slept 0.2"
        progress = [m for m in client.skipped if m.get("method") == "notifications/progress"]
        if "json" not in form:  # a server answering with plain JSON has nowhere to send a call's progress
            assert progress and progress[0]["params"]["progressToken"] == "p1"

        client.skipped.clear()
        assert _text(client.request(8, "tools/call", {"name": "remote__grow", "arguments": {}})) == "grown"

        def told_and_listed() -> bool:
            listed = client.request(9, "tools/list", {})["result"]["tools"]
            return any(t["name"] == "remote__extra" for t in listed)

        assert wait_for(told_and_listed, timeout=60, interval=0.5)
        assert wait_for(lambda: any(m.get("method") == "notifications/tools/list_changed" for m in client.skipped)
                        or _drain(client), timeout=30, interval=0.2)
    finally:
        status, stderr = client.close()
    assert status == 0, stderr
    assert "Traceback" not in stderr


def _drain(client: RawClient) -> bool:
    """Read what Bastion sent meanwhile into ``skipped``; False, so ``wait_for`` looks again."""
    try:
        client.skipped.append(client.recv(timeout=0.1))
    except TimeoutError:
        pass
    return False


def test_a_fastmcp_server_over_http_is_federated(tmp_path, remote_server):
    server = remote_server("--fastmcp")
    client = _federate(tmp_path, server.url)
    try:
        names = {tool["name"] for tool in client.request(1, "tools/list", {}, timeout=120)["result"]["tools"]}
        assert {"remote__echo", "remote__slow", "local__echo"} <= names
        assert _text(client.request(2, "tools/call", {"name": "remote__echo", "arguments": {"text": "fast"}})) == \
            "echo: fast"
        prompt = client.request(3, "prompts/get", {"name": "remote__greet", "arguments": {"name": "Bo"}})
        assert "Hello, Bo!" in json.dumps(prompt["result"])
        resources = client.request(4, "resources/list", {})["result"]["resources"]
        read = client.request(5, "resources/read", {"uri": resources[0]["uri"]})["result"]
        assert read["contents"][0]["text"] == "hello from the remote"
    finally:
        status, stderr = client.close()
    assert status == 0, stderr


@pytest.mark.parametrize("form", ["streamable-http-modern", "streamable-http-legacy", "sse"])
def test_configured_headers_reach_the_server_and_a_client_cannot_add_any(tmp_path, remote_server, monkeypatch, form):
    args, entry = SDK_FORMS[form]
    server = remote_server(*args)
    monkeypatch.setenv("BASTION_TEST_REMOTE_TOKEN", "s3cret-from-env")
    headers = {"Authorization": "Bearer ${env:BASTION_TEST_REMOTE_TOKEN}", "X-Team": "platform"}
    config = write_config(tmp_path / "bastion.json", {"remote": {"url": server.url, "headers": headers, **entry}})
    client = RawClient(config)
    try:
        client.initialize()
        # A client's attempts to hand the server credentials of its own: in _meta, in arguments, as headers.
        answer = client.request(1, "tools/call", {
            "name": "remote__headers", "arguments": {},
            "_meta": {"headers": {"Authorization": "Bearer client-token"}, "authorization": "Bearer client-token",
                      "X-Injected": "yes"}}, timeout=120)
        received = json.loads(_text(answer))
    finally:
        client.close()
    assert received["authorization"] == "Bearer s3cret-from-env"
    assert received["x-team"] == "platform"
    assert "client-token" not in json.dumps(received) and "x-injected" not in received


@pytest.mark.parametrize("form", ["streamable-http-legacy", "sse"])
def test_a_remote_servers_sampling_request_reaches_the_client_and_its_answer_goes_back(tmp_path, remote_server,
                                                                                       form):
    args, entry = SDK_FORMS[form]
    server = remote_server(*args)
    config = write_config(tmp_path / "bastion.json", {"remote": {"url": server.url, **entry}})
    client = RawClient(config)
    try:
        client.initialize(capabilities={"sampling": {}})
        client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "remote__ask", "arguments": {"question": "2+2?"}}})
        asked = client.recv(timeout=120)
        while asked.get("method") != "sampling/createMessage":
            assert asked.get("id") != 1, asked  # the call must not be answered before the model is asked
            asked = client.recv(timeout=120)
        assert "2+2?" in json.dumps(asked["params"]["messages"])
        client.send({"jsonrpc": "2.0", "id": asked["id"], "result": {
            "role": "assistant", "content": {"type": "text", "text": "four"}, "model": "test-model"}})
        assert _text(client.recv_response(1, timeout=120)) == "the model said: four"
    finally:
        status, stderr = client.close()
    assert status == 0 and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_a_remote_over_https_is_reached_over_http2_when_it_offers_it(tmp_path, remote_server, era):
    trustme = pytest.importorskip("trustme")
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    cert, key, ca = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.cert_chain_pems[0].write_to_path(str(cert))
    certificate.private_key_pem.write_to_path(str(key))
    authority.cert_pem.write_to_path(str(ca))
    server = remote_server("--tls", str(cert), str(key))
    assert server.url.startswith("https://")
    client = _federate(tmp_path, server.url, era=era, ca_file=str(ca))
    try:
        seen = json.loads(_text(client.request(1, "tools/call", {"name": "remote__headers", "arguments": {}},
                                               timeout=120)))
        assert _text(client.request(2, "tools/call", {"name": "remote__echo", "arguments": {"text": "h2"}})) == \
            "echo: h2"
    finally:
        status, stderr = client.close()
    assert seen[":http-version"] == "2", seen
    assert status == 0 and "Traceback" not in stderr, stderr


def test_a_remote_whose_certificate_is_not_trusted_is_refused_with_the_reason(tmp_path, remote_server):
    trustme = pytest.importorskip("trustme")
    certificate = trustme.CA().issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(str(cert))
    certificate.private_key_pem.write_to_path(str(key))
    server = remote_server("--tls", str(cert), str(key))
    client = _federate(tmp_path, server.url, startup_timeout=5)  # no ca_file: the system store does not know it
    try:
        refused = client.request(1, "tools/call", {"name": "remote__echo", "arguments": {"text": "x"}}, timeout=120)
    finally:
        status, stderr = client.close()
    assert refused["error"]["code"] == -32001 and "certificate" in refused["error"]["message"].lower(), refused
    assert status == 0 and "Traceback" not in stderr, stderr


def test_arguments_a_modern_tool_annotates_with_x_mcp_header_are_mirrored_as_headers(tmp_path, remote_server):
    server = remote_server()
    config = write_config(tmp_path / "bastion.json", {"remote": {"url": server.url, "era": "modern"}})
    client = RawClient(config)
    try:
        client.initialize()
        listed = client.request(1, "tools/list", {}, timeout=120)["result"]["tools"]
        schema = next(t for t in listed if t["name"] == "remote__regional")["inputSchema"]
        assert schema["properties"]["region"]["x-mcp-header"] == "Region"
        # The SDK's server refuses the call (-32020) unless the header mirrors the argument.
        answer = client.request(2, "tools/call", {"name": "remote__regional", "arguments": {"region": "eu-west"}})
        assert _text(answer) == "eu-west (header: eu-west)"
        unicode = client.request(3, "tools/call", {"name": "remote__regional", "arguments": {"region": "Zürich"}})
        assert _text(unicode).startswith("Zürich (header: =?base64?")
    finally:
        status, stderr = client.close()
    assert status == 0 and "Traceback" not in stderr, stderr


def test_a_legacy_session_opens_the_get_stream_and_is_deleted_when_bastion_closes(tmp_path, remote_server):
    events = tmp_path / "remote-events.log"
    server = remote_server(events=events)
    client = _federate(tmp_path, server.url, era="legacy")
    try:
        assert _text(client.request(1, "tools/call", {"name": "remote__echo", "arguments": {"text": "s"}},
                                    timeout=120)) == "echo: s"
        assert wait_for(lambda: any(line.startswith("GET /mcp ") for line in events.read_text().splitlines()),
                        timeout=60)
    finally:
        status, _ = client.close()
    assert status == 0
    lines = events.read_text().splitlines()
    posts = [line.split()[2] for line in lines if line.startswith("POST")]
    session = next(s for s in posts if s != "-")  # the initialize POST has none yet; every later one has it
    assert posts[0] == "-" and all(s == session for s in posts[1:])
    assert f"GET /mcp {session}" in lines and lines[-1] == f"DELETE /mcp {session}"
