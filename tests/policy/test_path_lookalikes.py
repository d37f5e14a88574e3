"""Path guard, generalised: every percent sign, %u escape, lone surrogate and separator or dot look-alike is refused.

The attack corpus (../shared/data/attacks/) is re-encoded the ways lax decoders read paths — overlong UTF-8
with invalid continuation bytes, %u code points of slash and dot look-alikes, mixtures of 0x2e and %u, the
look-alike characters themselves — and every variant must be refused, also by a guard that allows percent
signs and look-alikes (then each reading, with look-alikes read as the ASCII they imitate, must leave the root).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from bastion.policy.guards import PathRules, check_path
from bastion.policy.guards.lookalikes import SEPARATOR_OR_DOT_LOOKALIKES, as_ascii
from tests.policy.payloads import lines

# The characters no table lists but that render as a slash or a dot (see bastion/policy/guards/lookalikes.py).
_RENDERED_ALIKE = {"\u0337": "/", "\u0338": "/", "\u20e5": "\\", "\u3002": ".", "\uff61": "."}
_TARGETS = "/\\."


def _name_character(character: str) -> bool:
    category = unicodedata.category(character)
    return category[0] == "L" or category == "Nd"


def _derived_table() -> dict[str, str]:
    """The look-alike table worked out again from NFKC and Unicode's confusables (TR39)."""
    confusables = pytest.importorskip("confusable_homoglyphs.confusables")
    table: dict[str, str] = {}
    for code_point in range(0x80, 0x110000):
        character = chr(code_point)
        if _name_character(character) or unicodedata.category(character) in ("Cs", "Co", "Cn"):
            continue
        folded = unicodedata.normalize("NFKC", character)
        if any(target in folded for target in _TARGETS):
            table[character] = folded
    for target in _TARGETS:
        for homoglyph in confusables.is_confusable(target, greedy=True)[0]["homoglyphs"]:
            glyph = homoglyph["c"].strip("\u200e")  # the data wraps right-to-left glyphs in marks
            if len(glyph) == 1 and not _name_character(glyph):
                table.setdefault(glyph, target)
    for character, target in _RENDERED_ALIKE.items():
        table.setdefault(character, target)
    return table


def test_the_vendored_table_is_the_one_the_unicode_data_gives() -> None:
    assert SEPARATOR_OR_DOT_LOOKALIKES == _derived_table()


def test_the_table_holds_the_classic_look_alikes() -> None:
    for character in "\u2215\u2044\uff0f\u29f8\u2216\uff3c\ufe68\u2024\u2025\u2026\uff0e\ufe52":
        assert character in SEPARATOR_OR_DOT_LOOKALIKES, f"U+{ord(character):04X}"
    assert as_ascii("a\u2215\u2025\u2215etc") == "a/../etc"


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    (tmp_path / "data" / "docs").mkdir(parents=True)
    return tmp_path / "data"


SLASHES = [c for c, ascii_form in SEPARATOR_OR_DOT_LOOKALIKES.items() if ascii_form in ("/", "\\")]
DOTS = [c for c, ascii_form in SEPARATOR_OR_DOT_LOOKALIKES.items() if ascii_form == "."]
# Overlong and broken UTF-8 of "." and "/": lax decoders keep the low bits and ignore invalid continuation bytes.
OVERLONG_DOT = ["%c0%2e", "%c0%ae", "%c0%6e", "%c0%ee", "%e0%80%2e", "%e0%80%ae", "%f0%80%80%ae"]
OVERLONG_SLASH = ["%c0%2f", "%c0%af", "%e0%80%af", "%f0%80%80%af", "%c0%9v", "%c1%1c", "%c1%9c"]


def _variants(base: str) -> list[str]:
    """``base`` (a traversal written in ASCII) re-encoded every way this module's docstring names."""
    out = []
    for slash in SLASHES[:: max(1, len(SLASHES) // 6)] + ["%u2215", "%u2044", "%uff0f", "%u002f", "%u005c"]:
        out.append(base.replace("/", slash))
    for dot in DOTS[:: max(1, len(DOTS) // 6)] + ["%u2024", "%uff0e", "%u002e", "0x2e"]:
        out.append(base.replace(".", dot))
    for dot, slash in zip(OVERLONG_DOT, OVERLONG_SLASH):
        out.append(base.replace(".", dot).replace("/", slash))
        out.append(base.replace("/", slash))
    out.append(base.replace("..", "0x2e%u002e"))
    out.append(base.replace("..", "%u002e0x2e").replace("/", "%u2215"))
    out.append(base.replace("..", "\u2025"))
    return out


TRAVERSALS = ["../../../etc/passwd", "docs/../../../../etc/shadow", "a/../../x/../../../root/.ssh/id_rsa",
              "..\\..\\windows\\win.ini"]


@pytest.mark.parametrize("base", TRAVERSALS)
def test_re_encoded_traversals_are_refused(root: Path, base: str) -> None:
    strict = PathRules.build([str(root)])
    lax = PathRules.build([str(root)], allow_percent=True, allow_lookalikes=True, allow_backslash=True)
    for value in _variants(base):
        assert not check_path(value, strict).ok, ascii(value)
        assert not check_path(value, lax).ok, ascii(value)


def test_the_attack_corpus_re_encoded_is_refused(root: Path) -> None:
    strict = PathRules.build([str(root)])
    # The corpus's plain ASCII traversals (its encoded ones are refused as they are, see test_paths.py).
    bases = sorted({line.replace("{FILE}", "etc/passwd") for name in ("patt-deep_traversal.txt",
                    "patt-directory_traversal.txt") for line in lines(name) if "%" not in line and ".." in line
                    and line.isascii()})
    assert len(bases) > 100
    admitted = [value for base in bases for value in _variants(base) if check_path(value, strict).ok]
    assert admitted == []


def test_names_that_merely_look_like_separators_are_not_traversal_when_allowed(root: Path) -> None:
    # Read as the ASCII they imitate, these stay inside, so a guard that allows look-alikes admits them.
    lax = PathRules.build([str(root)], allow_lookalikes=True)
    for value in ("docs/a\u2215b.txt", "docs/x\u29f8y", "docs/note\u3002txt", "docs/1\u2044\u2082 cup.txt"):
        assert check_path(value, lax).ok, ascii(value)
        assert not check_path(value, PathRules.build([str(root)])).ok, ascii(value)
    # Those Unicode itself folds onto ASCII syntax (NFKC) stay encoded path syntax.
    for value in ("docs/\u2026notes.txt", "docs/a\uff0fb"):
        assert "encoded path syntax" in (check_path(value, lax).reason or ""), ascii(value)


@pytest.mark.parametrize("value, reason", [
    ("docs/100% done.txt", "percent sign"),
    ("docs/50%25 off.txt", "percent sign"),
    ("docs/%u0041.txt", "percent sign"),
    ("a\u2215..\u2215..\u2215etc\u2215passwd", "U+2215 DIVISION SLASH"),
    ("a\u29f8..\u29f8..\u29f8etc", "U+29F8 BIG SOLIDUS"),
    ("x\u2044..\u2044etc", "U+2044 FRACTION SLASH"),
    ("\u2025/etc", "U+2025 TWO DOT LEADER"),
    ("docs/\udcc0\udcaf..", "lone surrogate"),
])
def test_refusals_name_the_mark(root: Path, value: str, reason: str) -> None:
    verdict = check_path(value, PathRules.build([str(root)]))
    assert not verdict.ok and reason in (verdict.reason or ""), verdict.reason


def test_allow_percent_admits_literal_percent_signs_but_no_encoded_syntax(root: Path) -> None:
    rules = PathRules.build([str(root)], allow_percent=True)
    assert check_path("docs/100% done.txt", rules).ok
    assert check_path("docs/50%25 off.txt", rules).ok
    for value in ("docs/%2e%2e/%2e%2e/x", "docs/%c0%ae%c0%ae/x", "docs/%u002e%u002e/x", "a%e2%88%95..%e2%88%95etc",
                  "docs/%ed%b3%80%ed%b2%af"):
        assert not check_path(value, rules).ok, value
    assert "%u escape" in (check_path("docs/%u0041.txt", rules).reason or "")
    assert "U+2215" in (check_path("a%e2%88%95b", rules).reason or "")  # a percent-encoded look-alike


def test_plain_names_keep_passing(root: Path) -> None:
    rules = PathRules.build([str(root)])
    for value in ("docs/ノート.txt", "docs/日本語のファイル.txt", "docs/données été.txt", "docs/Ελληνικά/αρχείο.pdf",
                  "docs/report.final.v2.txt", "docs/0x2f00.bin", "docs/emoji \U0001f389 party.png"):
        assert check_path(value, rules).ok, value
