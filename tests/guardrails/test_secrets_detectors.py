"""The credential detectors on their own: each common kind is found and replaced by its marker, gitleaks' own
tests after a match (entropy, keywords, allowlists, stopwords) hold, placeholders and ordinary text pass, and the
scan of a string is the same whatever surrounds it."""

from __future__ import annotations

import random
import string

import pytest

from bastion.guardrails.config import GuardrailsConfig
from bastion.guardrails.content import text_slots
from bastion.guardrails.scanning import ScanningPolicy, default_scanner

_random = random.Random(7)


def _pick(alphabet: str, size: int) -> str:
    return "".join(_random.choice(alphabet) for _ in range(size))


ALNUM = string.ascii_letters + string.digits
AWS = "AKIA" + _pick(string.ascii_uppercase + "234567", 16)
CASES = [
    (f"aws_access_key_id={AWS}", AWS, "aws-access-key"),
    (f"token ghp_{_pick(ALNUM, 36)} end", None, "github-pat"),
    (f"GITLAB=glpat-{_pick(ALNUM, 20)}", None, "gitlab-pat"),
    (f"slack: xoxb-{_pick(string.digits, 12)}-{_pick(string.digits, 13)}-{_pick(ALNUM, 24)}", None, "slack-bot-token"),
    (f"stripe sk_live_{_pick(ALNUM, 24)}", None, "stripe-access-token"),
    (f"OPENAI_API_KEY=sk-proj-{_pick(ALNUM, 58)}T3BlbkFJ{_pick(ALNUM, 58)}", None, "openai-api-key"),
    (f"google AIza{_pick(ALNUM + '-_', 35)}", None, "gcp-api-key"),
    ("jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyf"
     "Q.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", None, "jwt"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(_pick(ALNUM + "+/", 70) for _ in range(6))
     + "\n-----END OPENSSH PRIVATE KEY-----", None, "private-key"),
    (f"mongodb+srv://svc:{_pick(ALNUM, 16)}@cluster0.mongodb.net/app", None, "connection-string-password"),
    (f'config.secret_key = "{_pick(ALNUM, 32)}"', None, "generic-api-key"),
]


@pytest.fixture(scope="module")
def scanner():
    return default_scanner()


def _redacted(scanner, text: str, config: GuardrailsConfig | None = None) -> tuple[str, list]:
    result = {"content": [{"type": "text", "text": text}]}
    hits = scanner.scan(text_slots("tools/call", result), ScanningPolicy(config or GuardrailsConfig()).action_for(None))
    return result["content"][0]["text"], hits


@pytest.mark.parametrize("text, value, kind", CASES, ids=[case[2] for case in CASES])
def test_each_common_kind_is_found_and_replaced_by_its_marker(scanner, text, value, kind):
    redacted, hits = _redacted(scanner, text)
    assert [hit.kind for hit in hits] == [kind]
    assert f"[redacted: {kind}]" in redacted
    if value is not None:
        assert value not in redacted
    again, _ = _redacted(scanner, f"line one\n{text}\nline three")
    assert again == f"line one\n{redacted}\nline three"


def test_the_name_beside_a_value_stays_readable(scanner):
    redacted, _ = _redacted(scanner, f"aws_access_key_id = {AWS}\nregion = eu-west-1")
    assert redacted == "aws_access_key_id = [redacted: aws-access-key]\nregion = eu-west-1"


@pytest.mark.parametrize("text", [
    "AKIAIOSFODNN7EXAMPLE",  # AWS's documented example key (gitleaks' allowlist)
    "commit 3f2a9c1b7e8d6f5a4c3b2a1908f7e6d5c4b3a291",  # forty hex digits without the rule's keyword
    "password = os.environ['DB_PASSWORD']",
    "postgres://app:${DB_PASSWORD}@db/app and mysql://root:<password>@localhost/x and redis://:****@cache:6379",
    'api_key = "YOUR_API_KEY_HERE"',
    "token = get_token(session)",
    "The secret to a good key lime pie is the crust.",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "uuid 7d0f3c2e-5b1a-4c8e-9f2d-6a4b8c0e1f3a",
    "    key: ed25519.Ed25519PrivateKey\n    key_cls = ed25519.Ed25519PrivateKey",  # names, not keys
    "from cryptography.hazmat.primitives.asymmetric.ed448 import (\n    Ed448PrivateKey,\n    Ed448PublicKey,\n)",
])
def test_ordinary_text_and_placeholders_pass(scanner, text):
    assert _redacted(scanner, text) == (text, [])


def test_a_generic_value_needs_entropy_and_a_digit(scanner):
    assert _redacted(scanner, 'secret = "correcthorsebatterystaple"')[1] == []
    assert _redacted(scanner, 'secret = "aaaaaaaaaaaaaaaa1111"')[1] == []


def test_block_and_off_per_kind_leave_the_value_for_the_caller(scanner):
    text = f"key {AWS} for ops"
    config = GuardrailsConfig.model_validate({"scanning": {"kinds": {"aws-access-key": "block"}}})
    redacted, hits = _redacted(scanner, text, config)
    assert redacted == text and [(hit.kind, hit.action) for hit in hits] == [("aws-access-key", "block")]
    off = GuardrailsConfig.model_validate({"secrets": "off"})
    assert _redacted(scanner, text, off) == (text, [])


def test_a_value_on_a_very_long_line_and_non_ascii_text_around_it(scanner):
    text = "é" * 50_000 + f" token {AWS} " + "ü" * 50_000
    redacted, hits = _redacted(scanner, text)
    assert [hit.kind for hit in hits] == ["aws-access-key"]
    assert redacted == "é" * 50_000 + " token [redacted: aws-access-key] " + "ü" * 50_000


def test_hits_name_the_kind_rule_and_place_never_the_value(scanner):
    result = {"content": [{"type": "text", "text": "ok"}, {"type": "text", "text": f"k={AWS}"}],
              "structuredContent": {"deep": [{"key": AWS}]}}
    hits = scanner.scan(text_slots("tools/call", result), ScanningPolicy(GuardrailsConfig()).action_for(None))
    assert [(hit.where, hit.rule) for hit in hits] == [
        ("content[1].text", "aws-access-token"), ("structuredContent.deep[0].key", "aws-access-token")]
    assert all(AWS not in repr(hit) for hit in hits)


def test_a_value_filed_under_a_key_like_name_in_structured_content_is_judged_by_that_name(scanner):
    secret = _pick(ALNUM, 40)
    result = {"content": [], "structuredContent": {"aws": {"secret": secret, "region": "eu-west-1"},
                                                   "commit": "9fceb02d0ae598e95dc970b74767f19372d61af8",
                                                   "notes": [secret]}}
    hits = scanner.scan(text_slots("tools/call", result), ScanningPolicy(GuardrailsConfig()).action_for(None))
    assert [(hit.where, hit.kind) for hit in hits] == [("structuredContent.aws.secret", "generic-api-key")]
    assert result["structuredContent"]["aws"] == {"secret": "[redacted: generic-api-key]", "region": "eu-west-1"}
    # Under no name (an item of a list) the same value is only a string: nothing says it is a key.
    assert result["structuredContent"]["notes"] == [secret]
