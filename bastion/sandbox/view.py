"""What a sandboxed server can see: the filesystem view, as a list of mounts for bwrap.

Only what the server needs to run is bound, read-only: the system's /usr and a few harmless /etc
files, the executable with its interpreter or runtime install (a virtual environment, a pyenv or
Node prefix), paths named in its arguments that exist and no grant shows, and the user's grants.
/tmp and $HOME are private, empty and writable; the rest of the root is read-only.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from bastion.argument_paths import argument_binds, under

log = logging.getLogger("bastion.sandbox")

SYSTEM_TREES = ("/usr",)
# Top-level names that are symlinks into /usr on merged-/usr systems and real directories elsewhere.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Nothing secret in these; they make the dynamic loader, TLS, time zones and name lookups work.
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/timezone",
    "/etc/ssl", "/etc/ca-certificates", "/etc/ca-certificates.conf", "/etc/pki", "/etc/nsswitch.conf",
    "/etc/hosts", "/etc/host.conf", "/etc/gai.conf", "/etc/mime.types", "/etc/alternatives",
    "/etc/os-release", "/etc/protocols", "/etc/services", "/etc/locale.alias", "/etc/nodejs",
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOX_UID = 65534
RUN_DIR = "/run/bastion"

MountKind = Literal["ro", "rw", "tmpfs", "symlink", "dir"]


@dataclass(frozen=True)
class Mount:
    kind: MountKind
    dest: str
    source: str = ""

    @property
    def depth(self) -> int:
        return len([part for part in self.dest.split("/") if part])

    def bwrap_args(self) -> list[str]:
        if self.kind == "ro":
            return ["--ro-bind", self.source, self.dest]
        if self.kind == "rw":
            return ["--bind", self.source, self.dest]
        if self.kind == "tmpfs":
            mode = "01777" if self.dest == "/tmp" else "0700"
            return ["--perms", mode, "--tmpfs", self.dest]
        if self.kind == "symlink":
            return ["--symlink", self.source, self.dest]
        return ["--dir", self.dest]


class CommandNotFound(FileNotFoundError):
    pass


def resolve_command(command: str, search_path: str, cwd: str | None) -> str:
    """Absolute path of the executable, looked up on the host PATH for a bare name like ``npx``."""
    if "/" in command:
        path = os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(command)))
        if os.access(path, os.X_OK) and os.path.isfile(path):
            return path
        raise CommandNotFound(f"command {command!r} is not an executable file ({path})")
    found = shutil.which(command, path=search_path)
    if found is None:
        raise CommandNotFound(f"command {command!r} was not found on PATH ({search_path})")
    return os.path.abspath(found)


VERSION_MANAGERS = ("pyenv", "rbenv", "nodenv")


def resolve_shim(executable: str, env: dict[str, str], cwd: str | None) -> str:
    """The real program behind a version-manager shim (``~/.pyenv/shims/python3``).

    A shim is a script that runs the manager itself, which lives in the user's home and is not
    bound into the sandbox; asking the manager once here lets the sandbox run the program directly.
    """
    shims = os.path.dirname(executable)
    root = os.path.dirname(shims)
    manager = os.path.basename(root).lstrip(".")
    if os.path.basename(shims) != "shims" or manager not in VERSION_MANAGERS:
        return executable
    for tool in (os.path.join(root, "bin", manager), os.path.join(root, "libexec", manager)):
        if os.access(tool, os.X_OK):
            result = subprocess.run([tool, "which", os.path.basename(executable)], capture_output=True, text=True,
                                    env=env, cwd=cwd, timeout=30, check=False)
            found = result.stdout.strip()
            if result.returncode == 0 and os.path.isfile(found):
                return found
    return executable


def is_system_path(path: str) -> bool:
    """Already visible through the /usr bind (symlinks out of it are still followed)."""
    return any(under(path, tree) for tree in SYSTEM_TREES) or any(
        under(path, link) and os.path.islink(link) for link in SYSTEM_LINKS
    )


def _venv_root(path: str) -> str | None:
    directory = os.path.dirname(path)
    while directory not in ("/", ""):
        if os.path.isfile(os.path.join(directory, "pyvenv.cfg")):
            return directory
        directory = os.path.dirname(directory)
    return None


def _venv_interpreter(venv: str) -> str:
    """The interpreter every program of a virtual environment runs with, and so the base Python its link leads to.

    Followed whatever names it: a ``#!`` line does, but where the venv's path makes that line longer than the
    kernel's 127 characters pip writes a ``#!/bin/sh`` wrapper instead (``'''exec' VENV/bin/python "$0" "$@"``),
    which names it only in the shell's words. Binding it for every venv program, rather than rewriting the
    command to run the script with the venv's python, keeps the program as its package made it (argv[0], its
    own wrapper) and also covers a program that starts ``sys.executable`` or another console script of its venv.
    """
    for name in ("python", "python3"):
        candidate = os.path.join(venv, "bin", name)
        if os.path.lexists(candidate):
            return candidate
    return os.path.join(venv, "bin", "python")


def _node_modules_root(path: str) -> str | None:
    """``/app/node_modules`` for anything inside it: a package resolves its dependencies up that tree."""
    parts = path.split("/")
    if "node_modules" not in parts:
        return None
    return "/".join(parts[: parts.index("node_modules") + 1])


def _prefix_root(path: str) -> str | None:
    """``/opt/node`` for ``/opt/node/bin/node``: a self-contained install with bin/ and lib/."""
    bin_dir = os.path.dirname(path)
    prefix = os.path.dirname(bin_dir)
    if os.path.basename(bin_dir) == "bin" and os.path.isdir(os.path.join(prefix, "lib")) and prefix not in ("/", ""):
        return prefix
    return None


def _shebang_interpreter(path: str, search_path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        return shutil.which(names[0], path=search_path) if names else None
    return words[0]


def runtime_paths(executable: str, search_path: str) -> tuple[list[str], list[str]]:
    """(paths to bind read-only, directories to put on PATH) for running ``executable``.

    Follows symlinks and ``#!`` interpreters; binds a whole install root (venv, pyenv or Node
    prefix) because interpreters load their standard library and packages from it.
    """
    binds: list[str] = []
    path_dirs: list[str] = [os.path.dirname(executable)]
    pending = [executable]
    seen: set[str] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if os.path.islink(current):
            target = os.path.join(os.path.dirname(current), os.readlink(current))
            pending.append(os.path.normpath(target))
        if not is_system_path(current):
            venv = _venv_root(current)
            root = venv or _node_modules_root(current) or _prefix_root(current) or current
            if root not in binds:
                binds.append(root)
            if venv:
                pending.append(_venv_interpreter(venv))
        interpreter = _shebang_interpreter(current, search_path)
        if interpreter:
            pending.append(interpreter)
            path_dirs.append(os.path.dirname(interpreter))
    return binds, list(dict.fromkeys(path_dirs))


def protected_dirs(home: str) -> list[str]:
    """Directories never bound implicitly: the root and every ancestor of the user's home."""
    protected = ["/"]
    directory = home
    while directory not in ("/", ""):
        directory = os.path.dirname(directory)
        protected.append(directory)
    return protected


def arg_paths(args: list[str], cwd: str | None, home: str, writable: tuple[str, ...] = (),
              read_only: tuple[str, ...] = ()) -> list[str]:
    """Paths named in the arguments to bind read-only: those no grant shows (bastion.argument_paths decides, for
    the review too)."""
    binds = argument_binds(args, base=cwd or os.getcwd(), home=home, writable=writable, read_only=read_only)
    for path in binds.refused:
        log.warning("not exposing %s named in the server's arguments: it would reveal the home "
                    "directory or the whole filesystem; grant narrower paths instead", path)
    return list(binds.read_only)


def system_mounts() -> list[Mount]:
    mounts = [Mount("ro", tree, tree) for tree in SYSTEM_TREES if os.path.isdir(tree)]
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            mounts.append(Mount("symlink", link, os.readlink(link)))
        elif os.path.isdir(link):
            mounts.append(Mount("ro", link, link))
    for entry in ETC_FILES:
        if os.path.islink(entry):
            mounts.append(Mount("symlink", entry, os.readlink(entry)))
        elif os.path.exists(entry):
            mounts.append(Mount("ro", entry, entry))
    return mounts


def identity_files(directory: str, home: str) -> list[Mount]:
    """A passwd and group naming only root and the sandbox user: the host's list of users stays hidden."""
    passwd = os.path.join(directory, "passwd")
    group = os.path.join(directory, "group")
    with open(passwd, "w") as handle:
        handle.write(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                     f"nobody:x:{SANDBOX_UID}:{SANDBOX_UID}:sandboxed MCP server:{home}:/usr/sbin/nologin\n")
    with open(group, "w") as handle:
        handle.write(f"root:x:0:\nnogroup:x:{SANDBOX_UID}:\n")
    return [Mount("ro", "/etc/passwd", passwd), Mount("ro", "/etc/group", group)]


def order_mounts(mounts: list[Mount]) -> list[Mount]:
    """Parents before children, so a grant inside $HOME lands on top of the private home, not under it.

    A path granted writable replaces the same path bound read-only for other reasons.
    """
    writable = {mount.dest for mount in mounts if mount.kind == "rw"}
    unique: dict[tuple[str, str], Mount] = {}
    for mount in mounts:
        if mount.kind == "ro" and mount.dest in writable:
            continue
        unique.setdefault((mount.kind, mount.dest), mount)
    return sorted(unique.values(), key=lambda mount: mount.depth)
