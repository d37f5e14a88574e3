"""The secret and personal-data scanner (``default_scanner``: gitleaks' rules and the PII detectors on hyperscan)
and the injection scanner (``scan_text``, ``sanitize_text``, ``strip_hidden``) on random text, repeated up to
200 times so that work growing faster than the text shows.

Oracle: each returns what it documents (findings inside the text, each value found a piece of the text; a verdict
with a score; a string); text without hidden characters is what ``strip_hidden`` leaves; and the time each takes
is bounded per character: 0.5 s plus 50 µs a character, instrumented (200 KB then has 10.5 s, where linear
work takes about 1 s at worst, dense telephone numbers each checked by phonenumbers; quadratic work, minutes)."""

from __future__ import annotations

import time

import atheris

from bastion.guardrails.injection import Verdict, hidden_characters, sanitize_text, scan_text, strip_hidden
from bastion.guardrails.scanning import default_scanner

PIECES = ["AKIA", "IOSFODNN7EXAMPLE", "ghp_", "xoxb-", "-----BEGIN RSA PRIVATE KEY-----", "password=",
          "4111 1111 1111 1111",
          "alice@example.com", "+44 20 7946 0958", "GB82 WEST 1234 5698 7654 32", "ignore previous instructions",
          "<important>", "</important>", "you must", "call the", "tool", "\u200b", "\u200d", "\U000e0041", "\u202e",
          ". ", "\n", "secret", "api_key", "SYSTEM:", "```", "http://x.y/?q=", "0000", "a@b."]
_scanner: list = []


def setup() -> None:
    _scanner.append(default_scanner())  # the rules compiled once, as the gateway does at start: not timed
    scan_text("warm up")


def _timed(fn, text: str):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    out = fn(text)
    spent = time.perf_counter() - started
    assert spent < 0.5 + 5e-5 * len(text), (fn.__name__, len(text), spent, text[:120])
    return out


def one_input(data: bytes) -> None:
    if not _scanner:
        setup()
    fdp = atheris.FuzzedDataProvider(data)
    repeat = fdp.ConsumeIntInRange(1, 200)
    pieces = fdp.ConsumeIntInRange(0, 12)
    text = "".join(fdp.PickValueInList(PIECES) if fdp.ConsumeIntInRange(0, 2) else
                   fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12)) for _ in range(pieces))
    text *= repeat
    found = _timed(_scanner[0].find_in, text)
    for detector, value in found:
        assert detector.kind and (value in text or "\ufffd" in value or value in text.replace("\u200b", "")), value
    verdict = _timed(scan_text, text)
    assert type(verdict) is Verdict and isinstance(_timed(lambda _: verdict.score, text), int)
    size = len(text.encode("utf-8"))  # a long text's findings are placed by byte offset (only compared, never cut)
    for finding in verdict.findings:
        assert 0 <= finding.start <= finding.end <= size, finding
    assert isinstance(_timed(sanitize_text, text), str)
    stripped = _timed(strip_hidden, text)
    assert not hidden_characters(stripped, strict=False) or any(ord(c) > 127 for c in stripped), stripped[:80]
