"""Credential detectors: the gitleaks rule set, read as gitleaks reads it, and the few rules it lacks.

The rules are gitleaks' own default configuration (``rules/gitleaks.toml``, MIT, its origin in ``rules/README.md``):
over two hundred services' token formats, private keys, JWTs, and its generic rule for high-entropy values next to
key-like names, each with gitleaks' entropy threshold, allowlists and stopwords. Rules that match file paths only
(there is no path here) are left out. What gitleaks does not cover and is written here by hand says why.
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from typing import Any

import re2

from bastion.guardrails.matching import Detector, shannon_entropy

RULES_FILE = "gitleaks.toml"
# A rule set spanning lines needs a longer look back than a single line's longest match.
_MULTILINE_LOOKBACK = 16384
# Names of kinds that read better in a marker than gitleaks' rule ids.
_KIND_NAMES = {"aws-access-token": "aws-access-key"}
# Rules scanned in a Hyperscan database of their own, each read only when one of its keywords is in the text. Timed
# one by one over 1 MB of source code, these two cost most (sourcegraph's "any 40 hex digits" 1.0 ms, connection
# strings 0.6 ms, the other 220 rules 0.1 to 0.5 ms each alone and 1.7 ms together); apart, the rest scans in less
# and sourcegraph's keywords are rarely there (valgrind: 52 to 47 million instructions for the whole scanner).
# Splitting off more (the generic rule, whose keywords nearly every text holds) only added passes.
_OWN_SHARD = frozenset({"sourcegraph-access-token"})

# Connection strings: gitleaks has no rule for a password in a URL's user information, the form that database,
# broker and cache clients print in errors and configuration dumps (postgres://app:PASSWORD@db/app). Only the
# password is the value; placeholders such as ``${DB_PASSWORD}``, ``{password}``, ``%(password)s``, ``<password>``, ``****`` and
# ``password`` are not.
_CONNECTION_STRING = (
    r"(?i)\b(?:postgres(?:ql)?|mysql|mariadb|mongodb(?:\+srv)?|redis(?:s)?|rediss|amqps?|mssql|sqlserver|oracle|"
    r"jdbc:[a-z0-9]+|clickhouse|cockroachdb|couchdb|neo4j(?:\+s)?|bolt|nats|kafka|ldaps?|ftp|sftp|smtps?|imaps?|"
    r"https?|ssh)://[^\s:/@'\"<>]{1,128}:([^\s/@'\"<>]{1,256})@[^\s/@'\"<>]+"
)
_PLACEHOLDER_PASSWORD = re.compile(
    rb"(?i)^(?:\$?\{+[^}]*\}+|\$[a-z_]\w*|%\(?[\w.-]*\)?[sd%]?|<[^>]*>|\*+|x+|\.+|pass(?:word)?|passwd|pwd|secret|changeme|"
    rb"your[_-]?password|redacted|\[redacted[^\]]*\]|\[?hidden\]?|mask(?:ed)?)$")


def _connection_password(value: bytes, _match: bytes, _line: bytes) -> bool:
    return _PLACEHOLDER_PASSWORD.match(value) is None


HAND_WRITTEN = (
    Detector("secrets", "connection-string-password", "bastion:connection-string-password", _CONNECTION_STRING,
             group=1, check=_connection_password, keywords=("://",), shard="secrets-connection-string"),
)


@functools.cache
def secret_detectors() -> tuple[Detector, ...]:
    """Every credential detector; read once, the result never changes."""
    rules_text = resources.files("bastion.guardrails").joinpath("rules", RULES_FILE).read_text(encoding="utf-8")
    config = tomllib.loads(rules_text)
    allow_everywhere = _Allowlist.of(config.get("allowlist", {}))
    detectors = [_from_rule(rule, allow_everywhere) for rule in config.get("rules", []) if "regex" in rule]
    return tuple(detectors) + HAND_WRITTEN


def secret_kinds() -> frozenset[str]:
    return frozenset(detector.kind for detector in secret_detectors())


# Added to gitleaks' allowlists of its generic rule, measured on the source of the installed packages (40 MB): names
# of types and modules beside a key-like word (``key: ed25519.Ed25519PrivateKey``, ``import Ed448PrivateKey``) were
# most of its false positives. A value that is a dotted path of identifiers, or CamelCase words each with a lower-case
# letter or digit after its capital, is a name, not a key (about 1 random key in 100 looks like the latter).
_NAMES_NOT_KEYS = {"regexes": [r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+$", r"^(?:[A-Z][a-z0-9]+)+$"]}


def _from_rule(rule: dict[str, Any], allow_everywhere: _Allowlist) -> Detector:
    pattern: str = rule["regex"]
    group = rule.get("secretGroup") or (1 if re2.compile(pattern.encode()).groups else 0)
    allowlists = [_Allowlist.of(entry) for entry in rule.get("allowlists", []) if _applies_without_a_path(entry)]
    if rule["id"] == "generic-api-key":
        allowlists.append(_Allowlist.of(_NAMES_NOT_KEYS))
    check = _RuleCheck(rule["id"], float(rule.get("entropy", 0.0)), (allow_everywhere, *allowlists))
    multiline = "[\\s\\S" in pattern or "(?s" in pattern
    return Detector("secrets", _KIND_NAMES.get(rule["id"], rule["id"]), rule["id"], pattern, group=group,
                    check=check, lookback=_MULTILINE_LOOKBACK if multiline else 512,
                    generic=rule["id"].startswith("generic"), keywords=tuple(rule.get("keywords", ())),
                    shard=f"secrets-{rule['id']}" if rule["id"] in _OWN_SHARD else "")


def _applies_without_a_path(entry: dict[str, Any]) -> bool:
    # An allowlist that needs a path as well ("AND") can never hold for content that has no path.
    return not (entry.get("paths") and str(entry.get("condition", "OR")).upper() == "AND")


class _Allowlist:
    __slots__ = ("regexes", "stopwords", "target")

    def __init__(self, target: str, regexes: tuple[Any, ...], stopwords: tuple[bytes, ...]) -> None:
        self.target = target
        self.regexes = regexes
        self.stopwords = stopwords

    @classmethod
    def of(cls, entry: dict[str, Any]) -> _Allowlist:
        regexes = tuple(re2.compile(pattern.encode()) for pattern in entry.get("regexes", []))
        stopwords = tuple(word.lower().encode() for word in entry.get("stopwords", []))
        return cls(entry.get("regexTarget", "secret"), regexes, stopwords)

    def allows(self, value: bytes, match: bytes, line: bytes) -> bool:
        target = {"match": match, "line": line}.get(self.target, value)
        if any(expression.search(target) for expression in self.regexes):
            return True
        lowered = value.lower()
        return any(word in lowered for word in self.stopwords)


class _RuleCheck:
    """gitleaks' tests after a rule's expression matched: entropy above the threshold (and, for its generic rules,
    at least one digit), and no allowlist that takes the value back."""

    __slots__ = ("allowlists", "entropy", "rule")

    def __init__(self, rule: str, entropy: float, allowlists: tuple[_Allowlist, ...]) -> None:
        self.rule = rule
        self.entropy = entropy
        self.allowlists = allowlists

    def __call__(self, value: bytes, match: bytes, line: bytes) -> bool:
        if self.entropy:
            if shannon_entropy(value) <= self.entropy:
                return False
            if self.rule.startswith("generic") and not any(48 <= byte <= 57 for byte in value):
                return False
        return not any(allowlist.allows(value, match, line) for allowlist in self.allowlists)

