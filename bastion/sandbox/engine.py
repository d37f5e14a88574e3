"""Finding bubblewrap: the distribution's ``bwrap`` on PATH, and nothing else (docs/sandbox.md says why)."""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass

# What `bastion sandbox doctor` and a refused start tell the user to run, per distribution family.
INSTALL_HINT = ("install your distribution's bubblewrap: apt-get install bubblewrap (Debian, Ubuntu), "
                "dnf install bubblewrap (Fedora), pacman -S bubblewrap (Arch), apk add bubblewrap (Alpine)")


class SandboxUnavailable(RuntimeError):
    """The host cannot run the sandbox; the message says what to install or enable."""


@dataclass(frozen=True)
class Engine:
    path: str
    version: str
    name: str = "bwrap"

    def describe(self) -> str:
        return f"{self.name} {self.version} ({self.path})"


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip().removeprefix("bubblewrap").strip() or "unknown"


@functools.lru_cache(maxsize=1)
def find_engine() -> Engine:
    """Resolved once per process: the binary does not move while the gateway runs. Only the distribution's build:
    it gets the distribution's security updates, which a copy shipped in a wheel would not."""
    system = shutil.which("bwrap")
    if system is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not on PATH; {INSTALL_HINT}")
    return Engine(system, _version(system))
