"""The personal-data detectors: each kind is found only when its library validator agrees (Luhn and a card network's
prefix, IBAN check digits, each country's identifier checksum, libphonenumber), and the numbers ordinary outputs
are full of pass."""

from __future__ import annotations

import pytest

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.content import text_slots
from bastion.guardrails.scanning import ScanningPolicy, default_scanner

FOUND = [
    ("write to jane.roe@acme-mail.io today", "email"),
    ("card 4539 1488 0343 6467 exp 12/30", "payment-card"),
    ("card 5555-5555-5555-4444", "payment-card"),
    ("amex 378282246310005", "payment-card"),
    ("IBAN GB82 WEST 1234 5698 7654 32", "iban"),
    ("IBAN DE89370400440532013000.", "iban"),
    ("SSN 536-90-4399", "us-ssn"),
    ("NI number AB 12 34 56 C", "uk-nino"),
    ("SIN 130-692-544", "ca-sin"),
    ("DNI 12345678Z", "es-dni"),
    ("NIE X1234567L", "es-nie"),
    ("CF RSSMRA85T10A562S", "it-codice-fiscale"),
    ("NIR 2 95 10 99 126 111 93", "fr-nir"),
    ("CPF 390.533.447-05", "br-cpf"),
    ("Aadhaar 2345 6789 0124", "in-aadhaar"),
    ("personnummer 811228-9874", "se-personnummer"),
    ("HETU 131052-308T", "fi-hetu"),
    ("call +1 650-253-0000", "phone"),
    ("call +44 20 7946 0958", "phone"),
    ("<a href='tel:+33142685300'>", "phone"),
]

PASSES = [
    "build-bot@ci pushed; clone git@github.com:org/repo.git; mail admin@example.com or x@host.test",
    "card 4539 1488 0343 6468 fails the checksum",  # one digit off
    "order 1234567890123456 shipped",  # Luhn-invalid sixteen digits
    "timestamp 1733062800000 and 1733062800123",
    "IBAN GB82 WEST 1234 5698 7654 33",  # wrong check digits
    "SSN 000-12-3456 and 666-12-3456",  # never issued
    "version 2.14.1.4111111111111111",
    "Date: 2026-12-01 19:31:11 +0000",
    "+1234 and +1 555 0100",  # too short, unassigned
    "phone 650-253-0000 without a country code",
    "sha1 9fceb02d0ae598e95dc970b74767f19372d61af8, uuid 7d0f3c2e-5b1a-4c8e-9f2d-6a4b8c0e1f3a",
    "ISBN 978-3-16-148410-0, port 8080, pid 4242, size 1048576 bytes",
    "eps = [1.19209290E-07, 6.10351563E-05]",  # a float's digits are not a DNI
]


@pytest.fixture(scope="module")
def scanner():
    return default_scanner()


def _kinds(scanner, text: str) -> tuple[str, list[str]]:
    result = {"content": [{"type": "text", "text": text}]}
    hits = scanner.scan(text_slots("tools/call", result), ScanningPolicy(GuardrailsConfig()).action_for(None))
    return result["content"][0]["text"], [hit.kind for hit in hits]


@pytest.mark.parametrize("text, kind", FOUND, ids=[f"{kind}-{index}" for index, (_, kind) in enumerate(FOUND)])
def test_each_kind_is_found_and_redacted(scanner, text, kind):
    redacted, kinds = _kinds(scanner, text)
    assert kinds == [kind]
    assert f"[redacted: {kind}]" in redacted


@pytest.mark.parametrize("text", PASSES)
def test_numbers_and_addresses_that_are_not_personal_data_pass(scanner, text):
    assert _kinds(scanner, text) == (text, [])


def test_an_email_redaction_keeps_the_words_around_it(scanner):
    assert _kinds(scanner, "From: Jane Roe <jane.roe@acme-mail.io>\nSubject: hi") == (
        "From: Jane Roe <[redacted: email]>\nSubject: hi", ["email"])


def test_pii_off_for_one_server_and_one_kind_on_everywhere(scanner):
    config = GuardrailsConfig.model_validate({"servers": {"crm": {"pii": "off"}},
                                              "scanning": {"servers": {"crm": {"payment-card": "block"}}}})
    policy = ScanningPolicy(config)
    result = {"content": [{"type": "text", "text": "jane.roe@acme-mail.io 4539 1488 0343 6467"}]}
    hits = scanner.scan(text_slots("tools/call", result), policy.action_for("crm"))
    assert [(hit.kind, hit.action) for hit in hits] == [("payment-card", "block")]
    hits = scanner.scan(text_slots("tools/call", result), policy.action_for("other"))
    assert [(hit.kind, hit.action) for hit in hits] == [("email", "redact"), ("payment-card", "redact")]
