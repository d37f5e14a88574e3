"""A request's header fields as the HTTP frontend reads them: names folded to lower case, values trimmed, and a field
repeated joined with ", " in the order it came (RFC 9110 5.3), in one pass however often it repeats."""

from __future__ import annotations

from bastion.frontends.http.wire import headers_of


def test_repeated_fields_are_joined_in_order_and_others_kept() -> None:
    raw = [(b"Accept", b" application/json "), (b"X-Trace", b"a"), (b"accept", b"text/event-stream"),
           (b"Host", b"127.0.0.1"), (b"x-trace", b"b"), (b"X-TRACE", b"c")]
    assert headers_of({"headers": raw}) == {"accept": "application/json, text/event-stream", "x-trace": "a, b, c",
                                            "host": "127.0.0.1"}


def test_a_field_repeated_many_times_is_read_whole() -> None:
    raw = [(b"x-many", str(n).encode()) for n in range(50_000)]
    assert headers_of({"headers": raw})["x-many"] == ", ".join(str(n) for n in range(50_000))
    assert headers_of({}) == {}
