"""A remote (url) server is sent the trace context as HTTP headers too, beside ``_meta``: the gateway's upstream
span with tracing on, the client's own untouched with tracing off; a value no header may carry is left out."""

from __future__ import annotations

import json

import pytest

from tests.http_upstream.conftest import remote_server  # noqa: F401 - the fixture
from tests.observability.otlp_receiver import OtlpReceiver
from tests.observability.test_tracing import CLIENT_SPAN, CLIENT_TRACE, CLIENT_TRACEPARENT
from tests.support import RawClient, write_config


def _headers_seen(tmp_path, url: str, tracing: dict | None, meta: dict) -> dict:
    config = write_config(tmp_path / "bastion.json", {"remote": {"url": url}})
    if tracing is not None:
        settings = json.loads(config.read_text())
        config.write_text(json.dumps({**settings, "tracing": tracing}))
    client = RawClient(config)
    try:
        client.initialize()
        answer = client.request(1, "tools/call", {"name": "remote__headers", "arguments": {}, "_meta": meta},
                                timeout=120)
    finally:
        client.close()
    return json.loads(answer["result"]["content"][0]["text"])


@pytest.mark.parametrize("answers", ["json", "event-stream"])
def test_tracing_on_sends_the_upstream_span_as_headers(tmp_path, remote_server, answers):  # noqa: F811
    server = remote_server(*(("--json-response",) if answers == "json" else ()))
    with OtlpReceiver() as receiver:
        seen = _headers_seen(tmp_path, server.url, {"otlp_endpoint": receiver.endpoint},
                             {"traceparent": CLIENT_TRACEPARENT, "baggage": "team=a"})
        spans = receiver.wait_for(lambda got: any(s.name == "upstream call" for s in got))
    upstream = next(s for s in spans if s.name == "upstream call" and s.trace_id == CLIENT_TRACE)
    assert seen["traceparent"] == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"
    assert upstream.span_id != CLIENT_SPAN and seen["baggage"] == "team=a"


def test_tracing_off_passes_the_clients_context_on_as_headers_and_drops_what_no_header_carries(tmp_path,
                                                                                             remote_server):  # noqa: F811
    server = remote_server("--json-response")
    seen = _headers_seen(tmp_path, server.url, None,
                         {"traceparent": CLIENT_TRACEPARENT, "tracestate": "a=1\r\nx-injected: yes"})
    assert seen["traceparent"] == CLIENT_TRACEPARENT
    assert "tracestate" not in seen and "x-injected" not in seen
