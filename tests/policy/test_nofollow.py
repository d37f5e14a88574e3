"""The one-call symbolic-link probe (openat2) against the lstat walk it shortcuts."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bastion.policy.guards import PathRules, check_path, paths
from bastion.policy.guards.nofollow import LINK, NO_LINK, symlink_free
from tests.properties import PROPERTY

pytestmark = pytest.mark.skipif(symlink_free is None, reason="openat2 is not available on this kernel")


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Links that stay inside the root, lead out of it, dangle, chain, and a file used as a directory."""
    base = tmp_path_factory.mktemp("maze")
    data = base / "data"
    (data / "docs" / "sub").mkdir(parents=True)
    (data / "docs" / "sub" / "page.md").write_text("x")
    (data / "notes.txt").write_text("x")
    (base / "outside").mkdir()
    (base / "outside" / "loot.txt").write_text("x")
    (data / "inner").symlink_to(data / "docs", target_is_directory=True)
    (data / "out").symlink_to(base / "outside", target_is_directory=True)
    (data / "docs" / "sub" / "up").symlink_to("../../../outside", target_is_directory=True)
    (data / "dangling").symlink_to(base / "missing")
    (data / "chain").symlink_to(data / "inner", target_is_directory=True)
    (data / "file-link").symlink_to(data / "notes.txt")
    return base


def test_the_probe_sees_links_anywhere_on_the_existing_path(maze: Path) -> None:
    data = maze / "data"
    assert symlink_free(str(data / "docs" / "sub" / "page.md")) is NO_LINK
    assert symlink_free(str(data / "docs" / "missing" / "deeper.md")) is NO_LINK
    assert symlink_free(str(data / "notes.txt" / "not-a-dir")) is NO_LINK
    assert symlink_free(str(data / "inner" / "sub")) is LINK
    assert symlink_free(str(data / "out")) is LINK
    assert symlink_free(str(data / "dangling")) is LINK
    assert symlink_free(str(data / "docs" / "sub" / "up" / "loot.txt")) is LINK
    assert symlink_free("/no\x00where") is None


def test_a_root_reached_through_a_link_is_walked_with_lstat(maze: Path) -> None:
    rules = PathRules.build([str(maze / "data" / "inner")])
    assert rules.linkless_roots == frozenset()
    assert check_path("sub/page.md", rules).ok
    assert not check_path("sub/up/loot.txt", rules).ok


PIECES = st.sampled_from(
    ["docs", "sub", "page.md", "inner", "out", "up", "dangling", "chain", "file-link", "notes.txt", "loot.txt",
     "missing", "new dir", "x.md"]
)


@settings(PROPERTY, max_examples=600)
@given(pieces=st.lists(PIECES, min_size=1, max_size=6))
@example(pieces=["docs", "sub", "up", "loot.txt"])
@example(pieces=["chain", "sub", "up"])
@example(pieces=["notes.txt", "x.md"])
@example(pieces=["dangling", "x.md"])
def test_the_probe_decides_as_the_lstat_walk_does(maze: Path, pieces: list[str]) -> None:
    rules = PathRules.build([str(maze / "data")])
    walk_only = dataclasses.replace(rules, linkless_roots=frozenset())
    absolute = str(maze / "data") + "/" + "/".join(pieces)
    root = str(maze / "data")
    assert paths._resolves_inside(absolute, root, rules) == paths._resolves_inside(absolute, root, walk_only)
    assert check_path(absolute, rules) == check_path(absolute, walk_only)


def test_a_link_made_after_a_check_is_seen_by_the_next_one(tmp_path: Path) -> None:
    """Only the lexical placement is remembered between calls, never what the file system held."""
    data = tmp_path / "data"
    (data / "reports").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    rules = PathRules.build([str(data)])
    assert check_path("reports/q3.md", rules).ok
    os.rmdir(data / "reports")
    (data / "reports").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert not check_path("reports/q3.md", rules).ok
