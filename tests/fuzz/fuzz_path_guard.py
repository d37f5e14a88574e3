"""Differential: the path guard (``check_path``) against the kernel's own resolution of the same path, in a scratch
tree of links that lead out, stay in, chain, dangle, loop and climb (the tree of tests/policy/
test_path_resolution.py's maze). The property test there draws random trees; this harness keeps one tree and lets
coverage steer the paths, names and encodings.

Oracle: the verdict is allow or deny only, and the same with openat2's one-call probe as with the lstat walk;
a path the kernel cannot resolve is refused; a path allowed lands, by the kernel's resolution of it as written,
inside the root; and a link-free path of plain names inside the root is allowed (no over-refusal)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import atheris

from bastion.policy.decision import GuardResult
from bastion.policy.guards import PathRules, check_path
from tests.policy.test_path_resolution import _inside_and_link_free, _kernel, _kernel_verdict

NAMES = ["root", "docs", "sub", "notes.txt", "deep", "rel", "inner", "chain-a", "chain-c", "slash", "fake", "up",
         "up2", "dangling-out", "dangling-in", "self", "ping", "new", "etc", "passwd", "secret.txt", "elsewhere",
         "..", ".", "", ".hidden", "%2e%2e", "..%2f", "\u2024\u2024", "\uff0e\uff0e", "\u2215", "~", "a\x00b", "0x2e"]
_state: dict[str, object] = {}


def setup() -> None:
    scratch = tempfile.mkdtemp(prefix="bastion-fuzz-paths-")  # under the caller's TMPDIR, which it removes
    top = Path(scratch).joinpath(*["level"] * 6)
    root, elsewhere, fake = top / "root", top / "elsewhere", top / "fake-slash"
    for directory in (root / "docs" / "sub", elsewhere / "deep" / "sub", fake / "etc"):
        directory.mkdir(parents=True)
    (root / "notes.txt").write_text("n")
    (elsewhere / "secret.txt").write_text("s")
    (fake / "etc" / "passwd").write_text("p")
    links = {"deep": str(elsewhere / "deep"), "rel": "../elsewhere/deep", "inner": "docs/sub", "chain-a": "chain-b",
             "chain-b": str(root / "chain-c"), "chain-c": "deep", "slash": "/", "fake": str(fake),
             "docs/up": "..", "docs/up2": "../..", "dangling-out": str(elsewhere / "new.txt"),
             "dangling-in": "docs/new.txt", "self": "self", "ping": "pong/x", "pong": "ping/y"}
    for name, target in links.items():
        (root / name).symlink_to(target)
    (top / "root-link").symlink_to(root, target_is_directory=True)
    for label, where in (("direct", root), ("linked", top / "root-link")):
        rules = PathRules.build([str(where)])
        _state[label] = (rules, dataclasses.replace(rules, linkless_roots=frozenset()))
    _state["real_root"] = _kernel(str(root), os.O_DIRECTORY)


def one_input(data: bytes) -> None:
    if not _state:
        setup()
    fdp = atheris.FuzzedDataProvider(data)
    rules, walked = _state[fdp.PickValueInList(["direct", "linked"])]
    pieces = [fdp.PickValueInList(NAMES) if fdp.ConsumeIntInRange(0, 4) else
              fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 6)) for _ in range(fdp.ConsumeIntInRange(0, 7))]
    absolute = fdp.ConsumeBool()
    value = "/".join(pieces)
    if absolute:
        value = rules.roots[0] + "/" + value
    elif value.startswith("/"):
        value = "." + value  # relative: never from the real "/"
    verdict = check_path(value, rules)
    assert type(verdict) is GuardResult and (verdict.reason is None or isinstance(verdict.reason, str))
    assert verdict == check_path(value, walked), value  # openat2's shortcut decides as the lstat walk does
    if "\x00" in value:
        assert not verdict.ok, value  # no kernel path holds a NUL: whatever the server does with it is not this
        return
    joined = value if absolute else rules.base + "/" + value
    kind, where = _kernel_verdict(joined)
    real_root = _state["real_root"]
    if kind == "fails":
        assert not verdict.ok, (value, kind)
    elif kind in ("lands", "new") and verdict.ok:
        assert where == real_root or (where or "").startswith(real_root + "/"), (value, kind, where)
    plain = all(p in NAMES[:22] for p in pieces) and ".." not in pieces
    if plain and not any(p.startswith(".") for p in pieces) and _inside_and_link_free(os.path.normpath(joined),
                                                                                      rules.roots[0]):
        assert verdict.ok, (value, verdict.reason)
