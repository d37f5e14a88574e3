"""Input-schema validation: compiled once per schema, 2020-12 by default, network $refs never fetched."""

from __future__ import annotations

import http.server
import threading

import pytest

from bastion.policy.guards import SchemaCache, check_schema

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "count": {"type": "integer", "minimum": 1}},
    "required": ["path"],
    "additionalProperties": False,
}


def test_valid_and_invalid_arguments() -> None:
    cache = SchemaCache()
    assert check_schema({"path": "a", "count": 2}, SCHEMA, cache).ok
    assert "required" in (check_schema({}, SCHEMA, cache).reason or "")
    assert "/count" in (check_schema({"path": "a", "count": 0}, SCHEMA, cache).reason or "")
    assert "additionalProperties" in (check_schema({"path": "a", "x": 1}, SCHEMA, cache).reason or "")


def test_refusal_does_not_echo_the_value() -> None:
    reason = check_schema({"path": "TOP-SECRET-VALUE", "count": "TOP-SECRET-VALUE"}, SCHEMA, SchemaCache()).reason
    assert reason and "TOP-SECRET-VALUE" not in reason


def test_compiled_once_per_schema_content() -> None:
    cache = SchemaCache()
    first = cache.validator(SCHEMA)
    assert cache.validator(SCHEMA) is first
    assert cache.validator(dict(SCHEMA)) is first  # equal content, another object: same compiled validator
    assert cache.validator({**SCHEMA, "required": []}) is not first


def test_draft_2020_12_keywords_apply_by_default() -> None:
    schema = {"type": "array", "prefixItems": [{"type": "string"}], "items": False}
    cache = SchemaCache()
    assert check_schema(["a"], schema, cache).ok
    assert not check_schema(["a", "b"], schema, cache).ok


def test_local_refs_resolve() -> None:
    schema = {"$defs": {"p": {"type": "string"}}, "type": "object", "properties": {"p": {"$ref": "#/$defs/p"}}}
    assert not check_schema({"p": 1}, schema, SchemaCache()).ok


@pytest.fixture()
def schema_server():
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def test_network_refs_are_never_fetched(schema_server) -> None:
    base, hits = schema_server
    schema = {"type": "object", "properties": {"p": {"$ref": f"{base}/p.json"}}}
    verdict = check_schema({"p": 1}, schema, SchemaCache())
    assert not verdict.ok and "offline" in (verdict.reason or "")
    verdict = check_schema({"p": "x"}, {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"{base}/x"}, SchemaCache())
    assert not verdict.ok
    assert hits == []


def test_no_schema_means_nothing_to_check() -> None:
    assert check_schema({"a": 1}, None, SchemaCache()).ok
