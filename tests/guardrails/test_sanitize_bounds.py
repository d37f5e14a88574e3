"""Sanitizing a definition's text takes time in proportion to its length, whatever a server writes into it.

Found by tests/fuzz/fuzz_scanners.py: the wrapper pattern ``<important>.*?</important>`` looked for the closing
tag from every opening one, so 220 KB of unclosed ``<important>`` took 35 s of the event loop."""

from __future__ import annotations

import re
import time

import pytest

from bastion.guardrails.injection import _without_wrapped, sanitize_text


@pytest.mark.parametrize("text", ["<important>" * 20_000, "<important> a <system> b " * 10_000,
                                  "< Instruction >" * 15_000 + "</instruction>"])
def test_many_unclosed_wrappers_are_sanitized_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    sanitize_text(text)
    assert time.perf_counter() - started < 3.0  # was 35 s for the first; linear is well under 0.5 s


_BEFORE = re.compile(r"<\s*(important|information|instructions?|system|hidden|secret)\s*>.*?<\s*/\s*\1\s*>",
                     re.IGNORECASE | re.DOTALL)


@pytest.mark.parametrize("text", [
    "keep <important>drop</important> keep",
    "a <IMPORTANT>x</important> b <system>y</System > c",
    "<important> never closed <system>x</system> tail",
    "<instructions>x</instruction> open <instruction>y</instruction> z",  # closed by a tag of its own name only
    "<secret>a</secret><secret>b</secret>tail",
    "<important><important>x</important>",
    "<<hidden>>x</hidden>>",
])
def test_wrapped_text_is_removed_as_the_pattern_did(text: str) -> None:
    assert _without_wrapped(text) == _BEFORE.sub(" ", text)
    assert sanitize_text(text) == sanitize_text(_BEFORE.sub(" ", text))
