"""Where Bastion keeps what it writes by default, following the XDG base directory variables.

Each function reads the environment when it is called, never at import, so a process (or a test) that sets
``XDG_STATE_HOME`` before building its configuration gets that place. A variable that is unset, empty or not
an absolute path is ignored, as the XDG specification says.
"""

from __future__ import annotations

import os
from pathlib import Path

APP = "bastion"


def _base(variable: str, *fallback: str) -> Path:
    value = os.environ.get(variable, "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home().joinpath(*fallback)


def state_home() -> Path:
    """``$XDG_STATE_HOME``, else ``~/.local/state``."""
    return _base("XDG_STATE_HOME", ".local", "state")


def config_home() -> Path:
    """``$XDG_CONFIG_HOME``, else ``~/.config``."""
    return _base("XDG_CONFIG_HOME", ".config")


def cache_home() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return _base("XDG_CACHE_HOME", ".cache")


def state_dir() -> Path:
    """Bastion's state: the audit trail, the approval queue, installed launcher packages, the demo's scratch."""
    return state_home() / APP


def config_dir() -> Path:
    """Bastion's own configuration files."""
    return config_home() / APP


def cache_dir() -> Path:
    """What only saves time and can be deleted at any moment: embeddings of tool texts, derived models."""
    return cache_home() / APP
