"""The path guard resolves a path the way the kernel does: component by component, a ".." after a symbolic
link applying to the link's target, never to the name as written.

Every tree here is built in a temporary folder. The guard and the property test's oracle only look paths up
(lstat, readlink, ``O_PATH`` opens); nothing is written through a link.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.policy.guards import PathRules, check_path
from tests.properties import PROPERTY

THROUGH_A_LINK = "the path leads outside the allowed directories through a symbolic link"
LOOP = "the path goes through more than 40 symbolic links (a loop)"
UP_FROM_MISSING = "the path has '..' after a name that does not exist or is not a directory"


def test_dot_dot_after_a_link_climbs_from_the_links_target(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "secret.txt").write_text("s")
    (root / "deep").symlink_to(elsewhere / "deep", target_is_directory=True)
    rules = PathRules.build([str(root)])
    assert not check_path("deep/secret.txt", rules).ok
    # The kernel opens this as elsewhere/secret.txt; read lexically it would be root/secret.txt.
    assert (root / "deep" / ".." / "secret.txt").read_text() == "s"
    assert not check_path("deep/../secret.txt", rules).ok
    assert not check_path(str(root / "deep" / ".." / "secret.txt"), rules).ok


@pytest.fixture()
def maze(tmp_path: Path) -> Path:
    """root/ with links inside it that lead out, stay in, chain, dangle and loop; elsewhere/ outside it."""
    root, elsewhere, fake = tmp_path / "root", tmp_path / "elsewhere", tmp_path / "fake-slash"
    for directory in (root / "docs" / "sub", elsewhere / "deep" / "sub", fake / "etc"):
        directory.mkdir(parents=True)
    (root / "notes.txt").write_text("n")
    (elsewhere / "secret.txt").write_text("s")
    (fake / "etc" / "passwd").write_text("p")
    (root / "deep").symlink_to(elsewhere / "deep")  # absolute, out
    (root / "rel").symlink_to("../elsewhere/deep")  # relative, out
    (root / "inner").symlink_to("docs/sub")  # relative, in
    (root / "chain-a").symlink_to("chain-b")  # chain-a -> chain-b -> chain-c -> deep (out)
    (root / "chain-b").symlink_to(root / "chain-c")
    (root / "chain-c").symlink_to("deep")
    (root / "slash").symlink_to("/")
    (root / "fake").symlink_to(fake)  # a "/" of its own, outside the root
    (root / "docs" / "up").symlink_to("..")  # climbs to root: stays in
    (root / "docs" / "up2").symlink_to("../..")  # climbs out of root
    (root / "dangling-out").symlink_to(elsewhere / "new.txt")
    (root / "dangling-in").symlink_to("docs/new.txt")
    (root / "dangling-dir").symlink_to(elsewhere / "missing-dir")
    (root / "self").symlink_to("self")
    (root / "ping").symlink_to("pong/x")
    (root / "pong").symlink_to("ping/y")
    return tmp_path


@pytest.fixture(params=["direct", "linked"])
def rules(request: pytest.FixtureRequest, maze: Path) -> PathRules:
    """The root as written (openat2's one-call probe applies) or reached through a link (the lstat walk)."""
    if request.param == "linked":
        (maze / "root-link").symlink_to(maze / "root", target_is_directory=True)
        return PathRules.build([str(maze / "root-link")])
    return PathRules.build([str(maze / "root")])


def _refused(value: str, rules: PathRules) -> str | None:
    return check_path(value, rules).reason


@pytest.mark.parametrize(
    "value, reason",
    [
        ("deep/../secret.txt", THROUGH_A_LINK),
        ("deep/./../secret.txt", THROUGH_A_LINK),  # "./" takes the every-reading path
        ("deep//../secret.txt", THROUGH_A_LINK),
        ("deep/sub/../../secret.txt", THROUGH_A_LINK),  # repeated ".."
        ("deep/sub/../..", THROUGH_A_LINK),
        ("deep/..", THROUGH_A_LINK),
        ("deep/../deep/sub", THROUGH_A_LINK),
        ("rel/../secret.txt", THROUGH_A_LINK),  # a relative target
        ("chain-a/../secret.txt", THROUGH_A_LINK),  # a chain of links
        ("chain-a/sub/../../secret.txt", THROUGH_A_LINK),
        ("slash/..", THROUGH_A_LINK),  # a link to "/"
        ("slash/SCRATCH/elsewhere/secret.txt", THROUGH_A_LINK),
        ("fake/etc/../etc/passwd", THROUGH_A_LINK),
        ("docs/up2/elsewhere/secret.txt", THROUGH_A_LINK),
        ("docs/up/../elsewhere/secret.txt", THROUGH_A_LINK),  # docs/up -> root: ".." is root's parent
        ("docs/up/../notes.txt", THROUGH_A_LINK),
        ("inner/../../elsewhere/secret.txt", "outside the allowed directories"),  # lexically out too
        ("dangling-out", THROUGH_A_LINK),  # open(O_CREAT) would create elsewhere/new.txt
        ("dangling-dir/x.txt", THROUGH_A_LINK),
        ("dangling-dir/../secret.txt", UP_FROM_MISSING),  # the kernel: ENOENT
        ("missing/../notes.txt", UP_FROM_MISSING),
        ("docs/missing/sub/../../notes.txt", UP_FROM_MISSING),
        ("notes.txt/../docs", UP_FROM_MISSING),  # the kernel: ENOTDIR
        ("self", LOOP),
        ("self/../notes.txt", LOOP),
        ("ping", LOOP),
        ("ping/../notes.txt", LOOP),
    ],
)
def test_every_form_of_climbing_through_a_link_is_refused(
    maze: Path, rules: PathRules, value: str, reason: str
) -> None:
    value = value.replace("/SCRATCH/", str(maze) + "/")
    for form in (value, rules.roots[0] + "/" + value):  # relative to the base, and absolute
        refused = _refused(form, rules)
        assert refused is not None and reason in refused, (form, refused)
        assert str(maze) not in refused


@pytest.mark.parametrize(
    "value",
    [
        "inner/../notes.txt",  # inner -> root/docs/sub: the kernel lands in root/docs
        "inner/../sub/../up/notes.txt",
        "docs/up/notes.txt",
        "docs/sub/../../notes.txt",
        "dangling-in",  # open(O_CREAT) creates root/docs/new.txt
        "new/dir/file.txt",  # a missing tail is a path to create
        "docs/new/./file.txt",
        "docs/sub/..",
        "chain-c/../../ROOT/notes.txt",  # out through a link and back in: the kernel lands in root/notes.txt
    ],
)
def test_climbing_that_stays_inside_is_admitted(maze: Path, rules: PathRules, value: str) -> None:
    root, real = rules.roots[0], str(maze / "root")
    value = value.replace("ROOT", os.path.basename(root))
    for landing, within in ((os.path.realpath(f"{root}/{value}"), real), (os.path.normpath(f"{root}/{value}"), root)):
        assert landing == within or landing.startswith(within + "/"), landing
    for form in (value, rules.roots[0] + "/" + value):
        assert check_path(form, rules).ok, (form, check_path(form, rules).reason)


def test_a_link_to_slash_leads_back_in_only_where_the_kernel_goes(maze: Path, rules: PathRules) -> None:
    root = str(maze / "root")
    assert check_path("slash" + root + "/notes.txt", rules).ok
    assert check_path("slash" + root + "/deep/../notes.txt", rules).reason == THROUGH_A_LINK


def test_the_base_directory_is_walked_too(maze: Path) -> None:
    root = maze / "root"
    assert not check_path("../secret.txt", PathRules.build([str(root)], base=str(root / "deep"))).ok
    assert not check_path("x.txt", PathRules.build([str(root)], base=str(root / "deep"))).ok
    through_inner = PathRules.build([str(root)], base=str(root / "inner"))
    assert check_path("../notes.md", through_inner).ok  # root/docs/notes.md, and lexically root/notes.md
    assert check_path("up/notes.txt", PathRules.build([str(root)], base=str(root / "docs"))).ok


def test_hidden_names_backslashes_and_tilde_keep_their_rules(maze: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = maze / "root"
    rules = PathRules.build([str(root)])
    assert "hidden" in (_refused("deep/../.env", rules) or "")
    assert "hidden" in (_refused("inner/../.env", rules) or "")
    assert "backslash" in (_refused("deep\\..\\secret.txt", rules) or "")
    lax = PathRules.build([str(root)], allow_backslash=True)
    assert _refused("deep\\..\\secret.txt", lax) == THROUGH_A_LINK  # read with "\\" as a separator
    assert check_path("inner\\..\\notes.txt", lax).ok
    monkeypatch.setenv("HOME", str(root))
    assert _refused("~/deep/../secret.txt", rules) == THROUGH_A_LINK
    assert check_path("~/inner/../notes.txt", rules).ok


def test_the_link_limit_is_the_kernels(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "end").mkdir(parents=True)
    for length in (40, 41):
        first = f"chain{length}-0"
        for hop in range(length):
            nxt = f"chain{length}-{hop + 1}" if hop + 1 < length else "end"
            (root / f"chain{length}-{hop}").symlink_to(nxt)
        try:
            os.stat(root / first / "..")
            kernel_follows = True
        except OSError as error:
            assert error.errno == errno.ELOOP
            kernel_follows = False
        rules = PathRules.build([str(root)])
        assert check_path(first + "/../end", rules).ok == kernel_follows == (length == 40)
        assert (check_path(first + "/x", rules).reason == LOOP) == (not kernel_follows)


def test_resolution_can_be_turned_off(maze: Path) -> None:
    rules = PathRules.build([str(maze / "root")], resolve_symlinks=False)
    assert check_path("deep/../secret.txt", rules).ok  # lexical only: root/secret.txt
    assert not check_path("../elsewhere/secret.txt", rules).ok


# The differential property: random trees of directories, files and links, random paths, and the kernel's own
# resolution (an O_PATH open, read back from /proc/self/fd) as the oracle.

NAMES = ["a", "b", "c"]
TARGET_PIECES = st.sampled_from(["a", "b", "c", "..", "..", ".", ""])
LINK_TARGETS = st.one_of(
    st.tuples(st.just("relative"), st.lists(TARGET_PIECES, min_size=1, max_size=4)),
    st.tuples(st.sampled_from(["root", "outside", "slash"]), st.lists(TARGET_PIECES, max_size=3)),
)
ENTRIES = st.lists(
    st.tuples(
        st.just(0) | st.integers(0, 30),  # the parent, among the directories made so far (often the root)
        st.sampled_from(NAMES),
        st.sampled_from(["dir", "dir", "file", "link", "link", "link"]),
        LINK_TARGETS,
    ),
    min_size=1,
    max_size=20,
)
ANY_PIECES = st.lists(st.sampled_from(NAMES * 2 + ["..", "..", ".", ""]), max_size=7)
# Down some names, up again, then down: the shape that climbs from a link's target.
DOWN_UP_DOWN = st.builds(
    lambda down, up, rest: down + up + rest,
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
    st.lists(st.just(".."), min_size=1, max_size=3),
    st.lists(st.sampled_from(NAMES + ["..", "."]), max_size=3),
)
PATHS = st.lists(st.tuples(st.booleans(), ANY_PIECES | DOWN_UP_DOWN), min_size=8, max_size=8)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Deep enough that ".." runs in the generated paths and link targets stay inside the temporary folder. Names
    # are fixed, never random: a random one could hold "0x", which the guard also reads as a hex literal.
    top = tmp_path_factory.mktemp("path-resolution")
    deep = top.joinpath(*["level"] * 12)
    deep.mkdir(parents=True)
    yield deep
    shutil.rmtree(top)


_CASES = itertools.count()


def _build(place: Path, entries: list[tuple[int, str, str, tuple[str, list[str]]]]) -> Path:
    tops = {"root": place / "root", "outside": place / "outside", "slash": place / "slash"}
    for top in tops.values():
        top.mkdir()
    directories = list(tops.values())
    for parent_index, name, kind, (anchor, pieces) in entries:
        path = directories[parent_index % len(directories)] / name
        if os.path.lexists(path):
            continue
        if kind == "dir":
            path.mkdir()
            directories.append(path)
        elif kind == "file":
            path.write_text(name)
        else:
            target = "/".join(pieces)
            if anchor != "relative":
                target = f"{tops[anchor]}/{target}"
            elif not target or target.startswith("/"):
                target = "." + target  # relative: never the real "/"
            os.symlink(target, path)
    return place


def _kernel(path: str, flags: int = 0) -> str:
    descriptor = os.open(path, os.O_PATH | flags)
    try:
        return os.readlink(f"/proc/self/fd/{descriptor}")
    finally:
        os.close(descriptor)


def _kernel_verdict(path: str) -> tuple[str, str | None]:
    """("lands", where) for an existing path; ("new", where) for one whose missing tail has no ".." and does not
    start at a dangling link (where open(O_CREAT) and mkdir -p put it); ("fails", None) when the kernel cannot
    resolve it and no directory made along the way could change that (ELOOP, or ".." after a missing name);
    ("unknown", None) otherwise."""
    try:
        return "lands", _kernel(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "fails", None
    parts = path.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            where = _kernel("/".join(parts[:cut]) or "/", os.O_DIRECTORY)
        except OSError:
            continue
        rest = [part for part in parts[cut:] if part not in ("", ".")]
        if ".." in rest:
            return "fails", None
        if rest and not os.path.lexists(f"{where}/{rest[0]}"):
            return "new", f"{where}/{'/'.join(rest)}"
        return "unknown", None
    return "unknown", None


def _inside_and_link_free(normal: str, root: str) -> bool:
    """Whether the normal path lies in ``root`` by its names and no existing component below the root is a link."""
    if normal != root and not normal.startswith(root + "/"):
        return False
    current = root
    for name in normal[len(root):].split("/")[1:]:
        current += "/" + name
        if os.path.islink(current):
            return False
        if not os.path.lexists(current):
            return True
    return True


@PROPERTY
@given(entries=ENTRIES, paths=PATHS, linked_root=st.booleans())
def test_the_guard_admits_only_where_the_kernel_lands_inside(
    scratch: Path, entries: list[tuple[int, str, str, tuple[str, list[str]]]],
    paths: list[tuple[bool, list[str]]], linked_root: bool,
) -> None:
    place = scratch / f"case{next(_CASES)}"
    place.mkdir()
    try:
        _build(place, entries)
        root = place / "root"
        if linked_root:
            (place / "root-link").symlink_to(root, target_is_directory=True)
        rules = PathRules.build([str(place / "root-link" if linked_root else root)])
        walked = dataclasses.replace(rules, linkless_roots=frozenset())
        real_root = _kernel(str(root), os.O_DIRECTORY)
        for absolute, pieces in paths:
            value = "/".join(pieces)
            if absolute:
                value = rules.roots[0] + "/" + value
            elif value.startswith("/"):
                value = "." + value  # relative: never from the real "/"
            joined = value if absolute else rules.base + "/" + value
            verdict = check_path(value, rules)
            assert verdict == check_path(value, walked), value  # openat2's shortcut decides as the lstat walk
            kind, where = _kernel_verdict(joined)
            if kind == "fails":
                assert not verdict.ok, (value, kind)
            elif kind in ("lands", "new") and verdict.ok:
                assert where == real_root or (where or "").startswith(real_root + "/"), (value, kind, where)
            if ".." not in pieces and _inside_and_link_free(os.path.normpath(joined), rules.roots[0]):
                assert verdict.ok, (value, verdict.reason)  # and no over-refusal where no link is met
    finally:
        shutil.rmtree(place)
