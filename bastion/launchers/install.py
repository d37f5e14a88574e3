"""Install a launcher's package with the host's own package client, outside the sandbox, into Bastion's cache.

The cache lives in Bastion's state directory (``$XDG_STATE_HOME/bastion/packages``), one folder per installed tree:
``npm/@scope+name@1.2.3-<digest>`` (an ``npm install --prefix`` tree) and ``python/name==1.2.3-<digest>`` (a virtual
environment), the digest naming every package of the tree with its version and hash, so configurations asking for
the same tree share one install and an install never stands for another tree of the same version. It is state rather than a cache that may vanish: a sandboxed server has no network, so a deleted
install would turn into a server that cannot start until the registry is reached again.

npm runs with ``--ignore-scripts``: an install script would run with the user's full rights, outside the sandbox
the server is kept in afterwards. For the same reason pip installs wheels only (``--only-binary=:all:``): building
a source distribution runs its build backend, code of the package's choosing.

The first install resolves the newest version the request allows and records the whole tree it got, every
package with its version and hash; an install from a lock file's tree is ``npm ci`` of that tree, or ``pip
--require-hashes`` of it, so the package client checks every file against the recorded hash.

Offline installs are the package clients' own settings, passed through the environment: ``npm_config_offline=true``
(npm's cache), ``PIP_NO_INDEX=1`` with ``PIP_FIND_LINKS=DIR`` (a wheelhouse).
"""

from __future__ import annotations

import asyncio
import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from bastion.launchers.environment import InstallEnvironment
from bastion.launchers.plan import LaunchPlan, python_extras, split_npm_spec
from bastion.launchers.satisfy import unsatisfied

INSTALL_TIMEOUT_S = 600.0  # a cold install of a large package over a slow link; never reached offline
QUOTED_LINES = 8  # of the package client's error output, quoted when an install fails
MARKER = "bastion-install.json"  # written last: a folder without it is an install that did not finish
# Wheels only: building a source distribution runs its build backend, code of the package's choosing, outside the
# sandbox (as npm's install scripts would, which --ignore-scripts turns off).
WHEELS_ONLY = "--only-binary=:all:"


class PackageInstallFailed(Exception):
    """The package client could not install the package; the message quotes its own last lines.

    ``permanent``: the same start would fail the same way, so the server is not restarted in a loop.
    """

    permanent = True
    ran_client = False  # True when the package client ran and failed: the message then names its configuration


@dataclass(frozen=True)
class Installed:
    ecosystem: str
    package: str
    version: str
    integrity: str  # npm's SRI string (sha512-…) or sha256=<hex> of the Python distribution file
    root: str  # the tree the server needs, read-only: the node_modules folder or the virtual environment
    program: str  # absolute path of the program to run
    # Every package installed with it, each with its version and hash: npm's hidden lock file's "packages", or
    # {name: {version, integrity}} of pip's report. Installing from it reproduces the same tree, every file checked.
    tree: Mapping[str, Any] = field(default_factory=dict)


def packages_dir(state: Path) -> Path:
    return state / "packages"


def tree_digest(tree: Mapping[str, Any], interpreter: str = "") -> str:
    """What names an install folder: every package of the tree with its version and hash (and, for Python, the
    interpreter its environment runs on). Two configurations asking for the same tree share one folder."""
    canonical = {name: [str(facts.get("version", "")), str(facts.get("integrity", ""))]
                 for name, facts in tree.items() if name and isinstance(facts, Mapping)}
    text = json.dumps({"tree": canonical, "interpreter": interpreter}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def install_folder(cache: Path, ecosystem: str, package: str, version: str, tree: Mapping[str, Any],
                   interpreter: str = "") -> Path:
    """``npm/@scope+name@1.2.3-<digest>`` or ``python/name==1.2.3-<digest>``: the package and version for people to
    read, the digest of the whole tree so that an install never stands for another tree of the same version."""
    safe = package.replace("/", "+")
    head = f"{safe}@{version}" if ecosystem == "npm" else f"{safe}=={version}"
    return cache / ecosystem / f"{head}-{tree_digest(tree, interpreter)}"


def installed_facts(cache: Path, ecosystem: str, package: str, version: str, tree: Mapping[str, Any],
                    interpreter: str = "") -> dict[str, Any] | None:
    """What the cache records of that locked tree when it is installed there, else None."""
    if not tree:
        return None
    return _read_marker(install_folder(cache, ecosystem, package, version, tree, interpreter))


def _installed_folder(cache: Path, plan: LaunchPlan, version: str, tree: Mapping[str, Any],
                      interpreter: str) -> tuple[Path, dict[str, Any] | None]:
    """The install of a locked version: its tree's own folder; for a lock that records no tree (an older lock
    file), any install of that version whose tree satisfies the request."""
    if tree:
        folder = install_folder(cache, plan.ecosystem, plan.package, version, tree, interpreter)
        return folder, _read_marker(folder)
    safe = plan.package.replace("/", "+")
    head = f"{safe}@{version}-" if plan.ecosystem == "npm" else f"{safe}=={version}-"
    for folder in sorted((cache / plan.ecosystem).glob(glob.escape(head) + "*")):
        facts = _read_marker(folder)
        if (facts is not None and unsatisfied(plan, version, facts.get("tree") or {}) is None
                and (not interpreter or os.path.realpath(folder / "bin" / "python") == interpreter)):
            return folder, facts
    return cache / plan.ecosystem / head, None


def python_interpreter(plan: LaunchPlan, path: str | None) -> str:
    """The interpreter a Python server's environment is made with: Bastion's own, or the one ``-p``/``--python``
    names (``3.12`` -> ``python3.12`` on PATH, a name, or a path), resolved to its real file."""
    if plan.python is None:
        return os.path.realpath(getattr(sys, "_base_executable", sys.executable) or sys.executable)
    wanted = plan.python
    if wanted.replace(".", "").isdigit():
        wanted = f"python{wanted}"
    found = wanted if os.path.isabs(wanted) and os.access(wanted, os.X_OK) else shutil.which(wanted, path=path)
    if found is None:
        raise PackageInstallFailed(f"{plan.launcher} asks for Python {plan.python!r}, and no {wanted} is on PATH; "
                                   "install that Python, or drop the option to use the Python running Bastion")
    return os.path.realpath(found)


async def install(plan: LaunchPlan, cache: Path, env: InstallEnvironment, *, version: str | None = None,
                  integrity: str | None = None, tree: Mapping[str, Any] | None = None) -> Installed:
    """The installed package for ``plan``: ``version`` exactly (checked against ``integrity``) or the newest the
    plan's request allows. An install already in the cache is used without running the package client.

    ``tree`` (what a lock file recorded with ``version``) installs exactly those dependencies, each checked by the
    package client against its recorded hash (``npm ci``, ``pip --require-hashes``). A failure names the
    configuration the package client was given."""
    try:
        if plan.ecosystem == "npm":
            installed = await _install_npm(plan, cache / "npm", env, version, tree or {})
        else:
            installed = await _install_python(plan, cache / "python", env, version, tree or {})
    except PackageInstallFailed as exc:
        if not exc.ran_client:
            raise
        used = await asyncio.to_thread(env.describe, plan.ecosystem)
        raise PackageInstallFailed(f"{exc}\n    configuration used: {used}") from None
    if integrity and installed.integrity != integrity:
        raise PackageInstallFailed(
            f"{installed.package} {installed.version} installed with integrity {installed.integrity}, but the lock "
            f"file records {integrity}: the package was changed since it was locked; if that is expected, run "
            "`bastion servers update` to lock what the registry now serves")
    return installed


# ------------------------------------------------------------------------------------------------------ npm
async def _install_npm(plan: LaunchPlan, cache: Path, envs: InstallEnvironment, version: str | None,
                       tree: Mapping[str, Any]) -> Installed:
    if version is not None:
        final, found = await asyncio.to_thread(_installed_folder, cache.parent, plan, version, tree, "")
        if found is not None:
            return _npm_installed(plan, final, found)
    npm = shutil.which("npm", path=envs.base.get("PATH"))
    if npm is None:
        raise PackageInstallFailed(f"{plan.launcher} server needs npm to install {plan.package}, and npm is not on "
                                   "PATH; install Node.js (which brings npm)")
    env = await envs.for_npm(npm)
    await asyncio.to_thread(cache.mkdir, parents=True, exist_ok=True)
    partial = cache / f".partial-{secrets.token_hex(6)}"
    spec = plan.requested if version is None else f"{plan.package}@{version}"
    quiet = ["--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"]
    try:
        if version is not None and tree:
            await asyncio.to_thread(_write_npm_project, partial, plan, version, tree)
            await _run([npm, "ci", "--prefix", str(partial), *quiet], env, what=f"npm ci {spec} (locked tree)")
        else:
            await _run([npm, "install", "--prefix", str(partial), "--no-save", *quiet, spec, *plan.extras], env,
                       what=f"npm install {' '.join([spec, *plan.extras])}")
        facts = await asyncio.to_thread(_npm_facts, partial, plan.package)
        final = install_folder(cache.parent, "npm", plan.package, facts["version"], facts["tree"])
        await asyncio.to_thread(_settle_npm, partial, final, facts)
    finally:
        await asyncio.to_thread(shutil.rmtree, partial, True)
    return _npm_installed(plan, final, facts)


def _write_npm_project(folder: Path, plan: LaunchPlan, version: str, tree: Mapping[str, Any]) -> None:
    """A project whose lock file is the recorded tree, for ``npm ci`` to install exactly that."""
    folder.mkdir(parents=True)
    dependencies = {plan.package: version}
    for extra in plan.extras:
        name = split_npm_spec(extra)[0]
        dependencies[name] = str((tree.get(f"node_modules/{name}") or {}).get("version", "*"))
    root = {"name": "bastion-install", "private": True, "dependencies": dependencies}
    lock = {"name": "bastion-install", "lockfileVersion": 3, "requires": True,
            "packages": {"": {k: v for k, v in root.items() if k != "private"}, **tree}}
    (folder / "package.json").write_text(json.dumps(root, indent=2) + "\n")
    (folder / "package-lock.json").write_text(json.dumps(lock, indent=2) + "\n")


def _npm_facts(prefix: Path, package: str) -> dict[str, Any]:
    """Version and integrity npm recorded for the package it installed, and the whole tree (its hidden lock file)."""
    hidden = prefix / "node_modules" / ".package-lock.json"
    try:
        packages = json.loads(hidden.read_text())["packages"]
        entry = packages[f"node_modules/{package}"]
    except (OSError, ValueError, KeyError) as exc:
        raise PackageInstallFailed(f"npm reported success but {hidden} does not list {package} ({exc})") from None
    return {"ecosystem": "npm", "package": package, "version": entry["version"], "integrity": entry.get("integrity", ""),
            "tree": packages}


def _settle_npm(partial: Path, final: Path, facts: dict[str, Any]) -> None:
    """Move a finished install into place; another process that got there first wins, its tree is as good."""
    if _read_marker(final) is not None:
        return
    (partial / MARKER).write_text(json.dumps(facts, indent=2) + "\n")
    try:
        os.rename(partial, final)  # npm's .bin links are relative, so the tree works from its new place
    except OSError:
        if _read_marker(final) is None:  # a half-written folder of a process that died: replace it
            shutil.rmtree(final, ignore_errors=True)
            os.rename(partial, final)


def _npm_installed(plan: LaunchPlan, folder: Path, facts: dict[str, Any]) -> Installed:
    modules = folder / "node_modules"
    program = _npm_program(modules, plan)
    return Installed("npm", facts["package"], facts["version"], facts["integrity"], str(modules), str(program),
                     facts.get("tree") or {})


def _npm_program(modules: Path, plan: LaunchPlan) -> Path:
    """The program npx would run: the one named, else the package's only bin, else the one named like it."""
    try:
        manifest = json.loads((modules / plan.package / "package.json").read_text())
    except (OSError, ValueError) as exc:
        raise PackageInstallFailed(f"{plan.package} was installed without a readable package.json ({exc})") from None
    bins = manifest.get("bin") or {}
    unscoped = plan.package.rsplit("/", 1)[-1]
    if isinstance(bins, str):
        bins = {unscoped: bins}
    if plan.bin is not None:
        chosen = plan.bin
    elif len(bins) == 1:
        chosen = next(iter(bins))
    elif unscoped in bins:
        chosen = unscoped
    else:
        raise PackageInstallFailed(
            f"{plan.package} has {len(bins)} programs ({', '.join(sorted(bins)) or 'none'}) and none is named like "
            f"the package; write `{plan.launcher} --package {plan.package} PROGRAM` in the configuration")
    program = modules / ".bin" / chosen
    if not program.exists():
        raise PackageInstallFailed(f"{plan.package} has no program {chosen!r} (it has: "
                                   f"{', '.join(sorted(bins)) or 'none'})")
    return program


# --------------------------------------------------------------------------------------------------- python
async def _install_python(plan: LaunchPlan, cache: Path, envs: InstallEnvironment, version: str | None,
                          tree: Mapping[str, Any]) -> Installed:
    if importlib.util.find_spec("pip") is None:
        raise PackageInstallFailed(f"{plan.launcher} servers are installed with pip, which the Python running Bastion "
                                   f"({sys.executable}) does not have; install it there (`{sys.executable} -m "
                                   "ensurepip`)")
    interpreter = python_interpreter(plan, envs.base.get("PATH"))
    if version is not None:
        final, found = await asyncio.to_thread(_installed_folder, cache.parent, plan, version, tree, interpreter)
        if found is not None:
            return _python_installed(plan, final, found)
    if version is not None and tree:
        locked = True
    else:
        # A virtual environment cannot be moved once made (its programs name its interpreter by path), so the tree
        # is found first, by a resolve that installs nothing; its folder is named by it, and may be there already.
        resolved = await _resolve_python(plan, cache, await envs.for_pip(), version, interpreter)
        version, tree, locked = resolved["version"], resolved["tree"], False
        final = install_folder(cache.parent, "python", plan.package, version, tree, interpreter)
    await asyncio.to_thread(cache.mkdir, parents=True, exist_ok=True)
    found = await asyncio.to_thread(_read_marker, final)
    if found is None:
        found = await _create_venv(plan, final, version, await envs.for_pip(), tree, interpreter, locked)
    return _python_installed(plan, final, found)


def _python_requirements(plan: LaunchPlan, version: str | None) -> list[str]:
    main = plan.requested if version is None else f"{plan.package}{python_extras(plan.requested)}=={version}"
    return [main, *plan.extras]


def _hashed_requirements(tree: Mapping[str, Any]) -> str:
    """A requirements file pinning every recorded distribution to its version and hash (pip --require-hashes)."""
    lines = []
    for name, facts in sorted(tree.items()):
        algorithm, _, digest = str(facts.get("integrity", "")).partition("=")
        if not digest:
            raise PackageInstallFailed(f"the lock file records no hash for {name}; run `bastion servers update`")
        lines.append(f"{name}=={facts['version']} --hash={algorithm}:{digest}")
    return "\n".join(lines) + "\n"


async def _resolve_python(plan: LaunchPlan, cache: Path, env: Mapping[str, str], version: str | None,
                          interpreter: str) -> dict[str, Any]:
    await asyncio.to_thread(cache.mkdir, parents=True, exist_ok=True)
    report = cache / f".resolve-{secrets.token_hex(6)}.json"
    try:
        await _run([sys.executable, "-m", "pip", "--python", interpreter, "install", "--dry-run",
                    "--ignore-installed", "--no-input", "--disable-pip-version-check", "--quiet", WHEELS_ONLY,
                    "--report", str(report), *_python_requirements(plan, version)], env,
                   what=f"pip install {' '.join(_python_requirements(plan, version))}")
        return await asyncio.to_thread(_report_facts, report, plan.package)
    finally:
        await asyncio.to_thread(_unlink, report)


async def _create_venv(plan: LaunchPlan, final: Path, version: str, env: Mapping[str, str],
                       tree: Mapping[str, Any], interpreter: str, locked: bool) -> dict[str, Any]:
    guard = final.with_name(f".{final.name}.lck")
    report = final.with_name(f".{final.name}.report.json")
    pinned = final.with_name(f".{final.name}.requirements.txt")
    async with _held(guard):
        found = await asyncio.to_thread(_read_marker, final)
        if found is not None:  # another process installed it while this one waited
            return found
        await asyncio.to_thread(shutil.rmtree, final, True)
        try:
            await _run([interpreter, "-m", "venv", "--without-pip", str(final)], env, what=f"{interpreter} -m venv")
            # Bastion's own pip installs into the new environment, which therefore needs no pip of its own. What is
            # installed is exactly the tree resolved (or locked), every file checked against its hash.
            await asyncio.to_thread(pinned.write_text, _hashed_requirements(tree))
            await _run([sys.executable, "-m", "pip", "--python", str(final / "bin" / "python"), "install",
                        "--no-input", "--disable-pip-version-check", "--quiet", WHEELS_ONLY, "--no-deps",
                        "--report", str(report), "--require-hashes", "-r", str(pinned)], env,
                       what=f"pip install {plan.package}=={version}" + (" (locked tree)" if locked else ""))
            facts = await asyncio.to_thread(_report_facts, report, plan.package)
            await asyncio.to_thread((final / MARKER).write_text, json.dumps(facts, indent=2) + "\n")
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, final, True)
            raise
        finally:
            await asyncio.to_thread(_unlink, report)
            await asyncio.to_thread(_unlink, pinned)
    return facts


def _report_facts(report: Path, package: str) -> dict[str, Any]:
    """Version and sha256 of the distribution pip chose for ``package``, and of every other it installed, from its
    ``--report`` JSON."""
    wanted = _normal(package)
    try:
        entries = json.loads(report.read_text())["install"]
        tree = {_normal(item["metadata"]["name"]): {"version": item["metadata"]["version"], "integrity": _hash_of(item)}
                for item in entries}
        main = tree[wanted]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackageInstallFailed(f"pip reported success but its report does not list {package} ({exc!r})") from None
    return {"ecosystem": "python", "package": package, "version": main["version"], "integrity": main["integrity"],
            "tree": tree}


def _hash_of(item: Mapping[str, Any]) -> str:
    archive = (item.get("download_info") or {}).get("archive_info") or {}
    digest = (archive.get("hashes") or {}).get("sha256")
    return f"sha256={digest}" if digest else str(archive.get("hash") or "")


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _python_installed(plan: LaunchPlan, venv: Path, facts: dict[str, Any]) -> Installed:
    program = venv / "bin" / (plan.bin or plan.package)
    if not program.is_file():
        available = sorted(p.name for p in (venv / "bin").iterdir() if not p.name.startswith(("python", "activate")))
        raise PackageInstallFailed(f"{plan.package} has no program {program.name!r} (it installed: "
                                   f"{', '.join(available) or 'none'}); name one with "
                                   f"`{plan.launcher} {'--from' if plan.launcher == 'uvx' else '--spec'} "
                                   f"{plan.package} PROGRAM`")
    return Installed("python", facts["package"], facts["version"], facts["integrity"], str(venv), str(program),
                     facts.get("tree") or {})


# --------------------------------------------------------------------------------------------------- common
def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        facts = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return facts if isinstance(facts, dict) and "version" in facts else None


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


class _held:
    """An exclusive file lock taken on a thread, so the event loop never waits on another process's install."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._handle: object = None

    async def __aenter__(self) -> None:
        def take() -> object:
            handle = open(self._path, "a")
            fcntl.flock(handle, fcntl.LOCK_EX)
            return handle

        self._handle = await asyncio.to_thread(take)

    async def __aexit__(self, *exc: object) -> None:
        handle = self._handle
        self._handle = None
        if handle is not None:
            await asyncio.to_thread(handle.close)  # type: ignore[attr-defined]  # closing releases the lock


async def _run(argv: list[str], env: Mapping[str, str], *, what: str) -> None:
    """Run a package client; a failure is its own last lines of output, quoted."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=dict(env), cwd="/")
    except OSError as exc:
        raise PackageInstallFailed(f"{what}: cannot run {argv[0]}: {exc.strerror}") from None
    try:
        output, _ = await asyncio.wait_for(process.communicate(), INSTALL_TIMEOUT_S)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise PackageInstallFailed(f"{what} did not finish within {INSTALL_TIMEOUT_S:g}s") from None
    except asyncio.CancelledError:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise
    if process.returncode != 0:
        lines = [line for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
        quoted = "\n".join(f"    {line}" for line in lines[-QUOTED_LINES:]) or "    (it printed nothing)"
        failed = PackageInstallFailed(f"{what} failed (exit status {process.returncode}):\n{quoted}")
        failed.ran_client = True
        raise failed

