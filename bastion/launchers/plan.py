"""Recognise a package launcher in a server's command line: what to install and what to run.

Published MCP configurations start servers with ``npx -y PKG``, ``uvx PKG``, ``pipx run PKG`` or ``bunx PKG``:
launchers that fetch the package from a registry at every start, which a sandboxed server with no network
cannot do. Reading such a command line into a :class:`LaunchPlan` lets Bastion install the package outside
the sandbox and run the installed program inside it. Pure: nothing here touches the disk or the network.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal, Sequence

Ecosystem = Literal["npm", "python"]

# An npm registry name: optional @scope/, then a lower-case name (dots, dashes, underscores allowed).
_NPM_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$")
# A Python distribution name with optional extras, then an optional version: ==1.2, @1.2, >=1, ~=1.2 ...
_PY_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[A-Za-z0-9._,\s-]+\])?"
                      r"(?P<version>(@|==|>=|<=|~=|!=|>|<).+)?$")

# Launcher options that take no value and change nothing about what runs.
_NPX_FLAGS = {"-y", "--yes", "-q", "--quiet", "--no-install", "--prefer-online", "--prefer-offline"}
_UVX_FLAGS = {"-q", "--quiet", "--offline", "--isolated", "--no-cache", "--refresh", "-n", "--no-progress"}
_PIPX_FLAGS = {"--no-cache", "-q", "--quiet", "-v", "--verbose", "--pypackages"}
_BUNX_FLAGS = {"-y", "--yes", "--bun", "--silent"}


@dataclass(frozen=True)
class LaunchPlan:
    """A server started through a launcher: the package to install and the program of it to run."""

    launcher: str  # npx, uvx, pipx or bunx, as written
    ecosystem: Ecosystem
    package: str  # the distribution's name, without version or extras: "@scope/server", "mcp-server-time"
    requested: str  # what the configuration asked for, as the package client reads it: "pkg@^1", "pkg==2.0"
    pinned: str | None  # the exact version the configuration names ("1.2.3"), or None for a range/latest
    bin: str | None  # the program to run; None: the package's own (npm: its only or same-named bin)
    args: tuple[str, ...]  # the server's own arguments
    extras: tuple[str, ...] = ()  # further packages installed beside it (uvx --with, npx's further --package)
    python: str | None = None  # the interpreter asked for (uvx -p, pipx run --python): "3.12", "python3.12", a path

    @property
    def key(self) -> str:
        """What the configuration asks for; a lock entry recorded for another request is not reused."""
        return " ".join([self.requested, *self.extras, *(["--python", self.python] if self.python else [])])


class NotALauncher(ValueError):
    """The command is a launcher written in a form Bastion does not read; the message says which part."""


def plan_launch(command: str, args: Sequence[str]) -> LaunchPlan | None:
    """The plan for ``command args``, or None when the command is not a package launcher.

    Raises :class:`NotALauncher` for a launcher given options Bastion cannot honour (``npx -c``, a git URL),
    so the caller can say so instead of silently running it with the network it will not have.
    """
    name = os.path.basename(command)
    words = list(args)
    if name == "npx":
        return _plan_npx("npx", words)
    if name == "bunx":
        return _plan_npx("bunx", words, flags=_BUNX_FLAGS)
    if name == "bun" and words[:1] == ["x"]:
        return _plan_npx("bunx", words[1:], flags=_BUNX_FLAGS)
    if name == "uvx":
        return _plan_python("uvx", words, flags=_UVX_FLAGS, from_option="--from")
    if name == "uv" and words[:2] == ["tool", "run"]:
        return _plan_python("uvx", words[2:], flags=_UVX_FLAGS, from_option="--from")
    if name == "pipx" and words[:1] == ["run"]:
        return _plan_python("pipx", words[1:], flags=_PIPX_FLAGS, from_option="--spec")
    return None


def _option_value(words: list[str], index: int, option: str) -> tuple[str, int]:
    """The value of ``--opt VALUE`` or ``--opt=VALUE`` at ``index``, and the index after it."""
    word = words[index]
    if "=" in word and word.startswith("--"):
        return word.split("=", 1)[1], index + 1
    if index + 1 >= len(words):
        raise NotALauncher(f"{option} needs a value")
    return words[index + 1], index + 2


def _plan_npx(launcher: str, words: list[str], flags: set[str] = _NPX_FLAGS) -> LaunchPlan:
    packages: list[str] = []
    index = 0
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        if word == "--":
            index += 1
            break
        if word in flags:
            index += 1
        elif word in ("-p", "--package") or word.startswith("--package="):
            value, index = _option_value(words, index, "--package")
            packages.append(value)
        else:
            raise NotALauncher(f"{launcher} option {word!r} is not one Bastion can run without the launcher")
    positional = words[index:]
    if not positional:
        raise NotALauncher(f"{launcher} is given no package to run")
    if packages:
        # Several --package options install them all, and the program is looked up among all their programs.
        spec, program, rest = packages[0], positional[0], positional[1:]
    else:
        spec, program, rest = positional[0], None, positional[1:]
    package, version = split_npm_spec(spec)
    for other in packages[1:]:
        split_npm_spec(other)
    return LaunchPlan(launcher, "npm", package, spec, _exact_npm(version), program, tuple(rest), tuple(packages[1:]))


def split_npm_spec(spec: str) -> tuple[str, str | None]:
    """``@scope/name@^1`` -> (``@scope/name``, ``^1``); a spec that is not a registry name is refused."""
    at = spec.find("@", 1)
    name, version = (spec, None) if at < 0 else (spec[:at], spec[at + 1:] or None)
    if not _NPM_NAME.match(name):
        raise NotALauncher(f"{spec!r} is not an npm registry package (git URLs, paths and tarballs are "
                           "not installed by Bastion)")
    return name, version


def _exact_npm(version: str | None) -> str | None:
    return version if version and re.fullmatch(r"\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?", version) else None


def python_extras(requested: str) -> str:
    """The ``[extra,...]`` part of a Python requirement as written, or ""."""
    match = _PY_SPEC.match(requested)
    return (match.group("extras") or "") if match else ""


# Options that would install from somewhere Bastion does not read (a file that may change, a working tree).
_PYTHON_REFUSED = {
    "--with-requirements": "reads a requirements file, which Bastion does not install from; name the packages "
                           "with --with PKG instead",
    "--with-editable": "installs a local working tree, which Bastion does not install; give the installed "
                       "program as the command instead",
    "--pip-args": "passes options to pip that Bastion cannot check; set them in pip.conf instead",
}


def _plan_python(launcher: str, words: list[str], flags: set[str], from_option: str) -> LaunchPlan:
    source: str | None = None
    extras: list[str] = []
    python: str | None = None
    index = 0
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        if word == "--":
            index += 1
            break
        if word in flags:
            index += 1
        elif word == from_option or word.startswith(from_option + "="):
            source, index = _option_value(words, index, from_option)
        elif launcher == "uvx" and (word in ("-w", "--with") or word.startswith("--with=")):
            value, index = _option_value(words, index, "--with")
            extras.extend(part.strip() for part in value.split(",") if part.strip())
        elif (launcher == "uvx" and word in ("-p", "--python")) or word == "--python" or word.startswith("--python="):
            python, index = _option_value(words, index, "--python")
        elif word.split("=", 1)[0] in _PYTHON_REFUSED:
            raise NotALauncher(f"{launcher} option {word.split('=', 1)[0]} {_PYTHON_REFUSED[word.split('=', 1)[0]]}")
        else:
            raise NotALauncher(f"{launcher} option {word!r} is not one Bastion can run without the launcher")
    positional = words[index:]
    if not positional:
        raise NotALauncher(f"{launcher} is given no package to run")
    if source is not None:
        spec, program, rest = source, positional[0], positional[1:]
    else:
        spec, rest = positional[0], positional[1:]
        program = None
    match = _PY_SPEC.match(spec)
    if match is None:
        raise NotALauncher(f"{spec!r} is not a PyPI package name (URLs and paths are not installed by Bastion)")
    version = match.group("version")
    requested = spec
    pinned: str | None = None
    if version and version.startswith("@"):
        # uvx's pkg@1.2 means ==1.2; pkg@latest means the newest
        bare = version[1:]
        requested = match.group("name") + (match.group("extras") or "") + ("" if bare == "latest" else f"=={bare}")
        pinned = None if bare == "latest" else bare
    elif version and version.startswith("=="):
        pinned = version[2:]
    package = match.group("name")
    for extra in extras:
        if not _PY_SPEC.match(extra):
            raise NotALauncher(f"--with {extra!r} is not a PyPI package name")
    return LaunchPlan(launcher, "python", package, requested, pinned, program or package, tuple(rest), tuple(extras),
                      python)
