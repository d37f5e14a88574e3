"""Path guard: every traversal payload refused, benign look-alikes inside the roots admitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bastion.policy.guards import PathRules, check_path, paths
from tests.properties import PROPERTY
from tests.policy.payloads import ATTACKS, traversal_payloads


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "data-evil").mkdir()
    (tmp_path / "data-evil" / "loot.txt").write_text("x")
    (tmp_path / "secret.txt").write_text("s")
    return tmp_path


def test_payload_lists_are_present() -> None:
    assert ATTACKS.is_dir(), f"attack lists expected at {ATTACKS}"
    assert len(traversal_payloads()) > 1500


def test_every_traversal_payload_is_refused(tree: Path) -> None:
    rules = PathRules.build([str(tree / "data")])
    admitted = [p for p in traversal_payloads() if check_path(p, rules).ok]
    assert admitted == []


def test_escape_from_a_subdirectory_is_refused(tree: Path) -> None:
    rules = PathRules.build([str(tree / "data")])
    for value in ("docs/../../secret.txt", "docs/%2e%2e/%2e%2e/secret.txt", "docs/..;/..;/secret.txt"):
        assert not check_path(value, rules).ok, value
    assert check_path("docs/../docs/ok.txt", rules).ok


BENIGN = [
    "report.txt",
    "docs/report.final.v2.txt",
    "docs/my file with spaces.md",
    "docs/a..b.txt",
    "docs/..data",  # a name starting with two dots is still hidden-file syntax; see allow_hidden test
    "docs/données été.txt",
    "docs/日本語のファイル.txt",
    "docs/Ελληνικά/αρχείο.pdf",
    "docs/emoji 🎉 party.png",
    "docs/0x2f00.bin",
    "docs/notes.",
    "./docs/./report.txt",
    "docs//report.txt",
    "docs/report.txt/",
    "docs/sub/../report.txt",  # docs/sub exists: the kernel climbs back out of it
    "",
]


@pytest.mark.parametrize("name", [b for b in BENIGN if not b.startswith("docs/..")])
def test_benign_names_inside_the_root_are_admitted(tree: Path, name: str) -> None:
    rules = PathRules.build([str(tree / "data")])
    assert check_path(name, rules).ok, check_path(name, rules).reason


def test_absolute_path_inside_the_root_is_admitted(tree: Path) -> None:
    rules = PathRules.build([str(tree / "data")])
    assert check_path(str(tree / "data" / "docs" / "café menu.txt"), rules).ok


def test_prefix_sibling_is_refused(tree: Path) -> None:
    rules = PathRules.build([str(tree / "data")])
    assert not check_path(str(tree / "data-evil" / "loot.txt"), rules).ok
    assert not check_path(str(tree / "data-evil"), rules).ok
    assert not check_path("../data-evil/loot.txt", rules).ok
    assert check_path(str(tree / "data"), rules).ok


def test_symlink_inside_root_pointing_out_is_refused(tree: Path) -> None:
    data = tree / "data"
    (data / "escape").symlink_to(tree / "secret.txt")
    (data / "outdir").symlink_to(tree / "data-evil", target_is_directory=True)
    (data / "inner").symlink_to(data / "docs", target_is_directory=True)
    rules = PathRules.build([str(data)])
    assert check_path("escape", rules).reason == "the path leads outside the allowed directories through a symbolic link"
    assert not check_path("outdir/loot.txt", rules).ok
    assert not check_path("outdir/not-yet-created.txt", rules).ok
    assert check_path("inner/new.txt", rules).ok  # a link that stays inside is fine


def test_symlink_deeper_down_pointing_out_is_refused(tree: Path) -> None:
    deep = tree / "data" / "docs" / "sub"
    (deep / "out").symlink_to(tree / "data-evil", target_is_directory=True)
    rules = PathRules.build([str(tree / "data")])
    for value in ("docs/sub/out/loot.txt", "docs/sub/out", "docs/sub/out/new/deeper.txt", str(deep / "out" / "x")):
        assert check_path(value, rules).reason == "the path leads outside the allowed directories through a symbolic link"
    assert check_path("docs/sub/new.txt", rules).ok
    assert check_path("docs/sub/outside-is-just-a-name.txt", rules).ok


def test_symlinked_root_admits_its_contents(tree: Path) -> None:
    (tree / "link-to-data").symlink_to(tree / "data", target_is_directory=True)
    rules = PathRules.build([str(tree / "link-to-data")])
    assert check_path(str(tree / "link-to-data" / "docs" / "x.txt"), rules).ok
    assert not check_path(str(tree / "data-evil" / "loot.txt"), rules).ok


def test_symlink_loop_is_not_a_way_out(tree: Path) -> None:
    data = tree / "data"
    os.symlink("loop-b", data / "loop-a")
    os.symlink("loop-a", data / "loop-b")
    rules = PathRules.build([str(data)])
    # The kernel fails with ELOOP; the guard refuses rather than guess where the loop would lead.
    for value in ("loop-a", "loop-a/x", "loop-b/../x"):
        assert check_path(value, rules).reason == "the path goes through more than 40 symbolic links (a loop)", value


def test_tilde_is_expanded_like_a_shell_would(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tree / "data"))
    rules = PathRules.build([str(tree / "data")])
    assert check_path("~/docs/x.txt", rules).ok
    assert not check_path("~root/.ssh/id_rsa", rules).ok


@pytest.mark.parametrize(
    "value, reason",
    [
        ("docs/a\x00.txt", "NUL or control"),
        ("docs/a%00.txt", "NUL or control"),
        ("docs%2f..%2f..%2fsecret.txt", "percent sign"),
        ("%2e%68%74%61%63%63%65%73%73", "percent sign"),
        ("docs/.env", "hidden"),
        ("C:\\Windows\\win.ini", "backslash"),
        ("docs/" + "A" * 300, "too long"),
        ("file:///etc/passwd", "outside"),
        ("／etc／passwd", "looks like a separator"),  # fullwidth look-alikes count as encodings
        ("docs/．．/．．/secret.txt", "looks like a separator or a dot"),
    ],
)
def test_refusals_say_why_without_echoing_the_roots(tree: Path, value: str, reason: str) -> None:
    rules = PathRules.build([str(tree / "data")])
    verdict = check_path(value, rules)
    assert not verdict.ok and reason in (verdict.reason or "")
    assert str(tree) not in (verdict.reason or "")


def test_hidden_names_admitted_when_configured(tree: Path) -> None:
    rules = PathRules.build([str(tree / "data")], allow_hidden=True)
    assert check_path("docs/.gitignore", rules).ok
    assert not check_path("../.bashrc", rules).ok


def test_root_under_a_hidden_directory_is_usable(tree: Path) -> None:
    root = tree / ".cache" / "work"
    root.mkdir(parents=True)
    rules = PathRules.build([str(root)])
    assert check_path(str(root / "a.txt"), rules).ok


def test_non_string_is_refused(tree: Path) -> None:
    rules = PathRules.build([str(tree / "data")])
    assert not check_path(["docs"], rules).ok


PATH_PIECES = st.sampled_from(
    ["docs", "data", "data-evil", "sub", "out", "inner", "escape", "new.txt", "a b", ".", "..", "...", "", "/", "//",
     "~", "~root", "%2e", "%2f", "%", ";", ";x", ":", "C:", "0x2e", "0X2F", "x.", "x ", " ", "\\", "é", "．", "\t",
     "report.final.v2.txt", ".env", "loot.txt"]
)


@settings(PROPERTY, max_examples=1000)
@given(pieces=st.lists(PATH_PIECES, min_size=1, max_size=8), separator=st.sampled_from(["/", "", "/", "/./"]))
@example(pieces=["escape./x"], separator="/")
@example(pieces=["escape /x"], separator="/")
@example(pieces=["escape."], separator="/")
@example(pieces=["docs/sub/out ."], separator="/")
@example(pieces=["C:/docs"], separator="/")
@example(pieces=["docs/0x2e0x2e/0x2e0x2e/x"], separator="/")
@example(pieces=["escape...", "x"], separator="/")
def test_plain_shortcut_agrees_with_every_reading(links: Path, pieces: list[str], separator: str) -> None:
    rules = PathRules.build([str(links / "data")])
    value = separator.join(pieces)
    for candidate in (value, str(links / "data") + "/" + value, "../" + value):
        if paths._plain(candidate):
            assert paths._check_plain(candidate, rules) == paths._check_readings(candidate, rules), candidate


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with symbolic links that stay inside the root and ones that lead out."""
    base = tmp_path_factory.mktemp("links")
    data = base / "data"
    (data / "docs" / "sub").mkdir(parents=True)
    (base / "data-evil").mkdir()
    (data / "escape").symlink_to(base / "data-evil", target_is_directory=True)
    (data / "docs" / "sub" / "out").symlink_to(base / "data-evil", target_is_directory=True)
    (data / "inner").symlink_to(data / "docs", target_is_directory=True)
    return base
