"""A user's machine in a temporary folder: a home with the client files people actually have."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASTION = str(ROOT / ".venv" / "bin" / "bastion")
FILESYSTEM_SERVER = ROOT / "node_modules" / ".bin" / "mcp-server-filesystem"


@dataclass
class Machine:
    home: Path
    config_home: Path
    state_home: Path
    project: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.config_home),
                "XDG_STATE_HOME": str(self.state_home), "XDG_CACHE_HOME": str(self.home / ".cache")}

    def bastion(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run([BASTION, *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              cwd=self.project, stdin=subprocess.DEVNULL)

    def write_json(self, relative: str, data: object, *, base: Path | None = None) -> Path:
        path = (base or self.home) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @property
    def bastion_toml(self) -> Path:
        return self.config_home / "bastion" / "bastion.toml"


@pytest.fixture
def machine(tmp_path) -> Machine:
    home = tmp_path / "home" / "ana"
    for folder in ("Documents", "Desktop", "projects/site"):
        (home / folder).mkdir(parents=True)
    (home / "Documents" / "notes.txt").write_text("groceries\n")
    return Machine(home, home / ".config", home / ".local" / "state", home / "projects" / "site")


def claude_desktop_file(machine: Machine) -> dict:
    """What the Claude Desktop quick start has people write, plus a server with a secret in its env."""
    return {"mcpServers": {
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                                  f"{machine.home}/Documents", f"{machine.home}/Desktop",
                                                  str(machine.home)]},
        "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                   "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_example"}},
        "weather": {"url": "https://weather.example.com/mcp"},
    }}
