"""A small reader of deploy/image/Dockerfile for the tests: its instructions (continuation lines joined, comments
dropped) grouped into stages. No Docker engine runs on the test machine and no registry is reachable, so the image
is never built here; what can be checked is what the file says, and (test_image_runtime.py) how Bastion behaves
under the conditions the file and the manifests set."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
ENTRYPOINT = ROOT / "deploy" / "image" / "entrypoint.sh"


@dataclass
class Instruction:
    keyword: str
    arguments: str

    def words(self) -> list[str]:
        """The arguments as the exec (JSON) form or as shell words."""
        text = self.arguments.strip()
        if text.startswith("["):
            return json.loads(text)
        return shlex.split(text)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for word in shlex.split(instruction.arguments):
                name, _, value = word.partition("=")
                values[name] = value
        return values


def instructions(text: str) -> list[Instruction]:
    found: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        found.append(Instruction(keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return found


def stages(text: str) -> tuple[list[Instruction], list[Stage]]:
    """The instructions before the first FROM (global ARGs), and each stage."""
    preamble: list[Instruction] = []
    found: list[Stage] = []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = instruction.arguments.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name))
        elif found:
            found[-1].instructions.append(instruction)
        else:
            preamble.append(instruction)
    return preamble, found
