"""The variables MCP clients expand in their server entries, and the dotenv files their ``envFile`` names.

VS Code and Cursor write ``${workspaceFolder}``, ``${userHome}``, ``${env:NAME}`` and ``${input:ID}``;
Claude Code writes ``${NAME}`` and ``${NAME:-default}``. Bastion expands all of them the way those clients
do, except ``${input:ID}``: a client asks the person for it, Bastion cannot, so it is read from the
environment variable ``BASTION_INPUT_<ID>`` or refused. Bastion adds ``${file:PATH}``, a secrets file's
contents (a mounted Kubernetes or Docker secret), so a credential need be in neither the configuration nor the
environment. Nothing here reads files but ``read_dotenv`` and ``${file:PATH}``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class VariableError(Exception):
    """A variable that cannot be expanded; ``fix`` says what to do about it."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Variables:
    """What the variables of one configuration file expand to."""

    workspace_folder: Path
    user_home: Path
    environ: Mapping[str, str]

    @classmethod
    def for_file(cls, file: Path, environ: Mapping[str, str] | None = None) -> "Variables":
        return cls(workspace_folder(file), Path(os.path.expanduser("~")), os.environ if environ is None else environ)

    def expand(self, text: str) -> str:
        return _VARIABLE.sub(lambda match: self._value(match.group(1)), text)

    def _value(self, name: str) -> str:
        if name == "workspaceFolder":
            return str(self.workspace_folder)
        if name == "workspaceFolderBasename":
            return self.workspace_folder.name
        if name == "userHome":
            return str(self.user_home)
        if name in ("pathSeparator", "/"):
            return os.sep
        if name.startswith("env:"):
            return self._environment(name[4:], None)
        if name.startswith("input:"):
            return self._input(name[6:])
        if name.startswith("file:"):
            return self._file(name[5:])
        variable, has_default, default = name.partition(":-")
        if _PLAIN_NAME.fullmatch(variable):
            return self._environment(variable, default if has_default else None)
        raise VariableError(f"${{{name}}} is not a variable Bastion knows",
                            "use ${workspaceFolder}, ${userHome}, ${env:NAME}, ${file:PATH} or ${NAME}, or write the "
                            "value itself")

    def _environment(self, name: str, default: str | None) -> str:
        value = self.environ.get(name)
        if value is not None:
            return value
        if default is not None:
            return default
        raise VariableError(f"the environment variable {name} is not set",
                            f"set {name} in the environment Bastion starts in, or write the value itself")

    def _file(self, name: str) -> str:
        """A secrets file's contents without its final line break; a relative path is the configuration's
        folder's. The error names the path, never any of the contents."""
        if not name.strip():
            raise VariableError("${file:} names no file", "write ${file:/run/secrets/NAME}, the secret file's path")
        path = Path(os.path.expanduser(name))
        if not path.is_absolute():
            path = self.workspace_folder / path
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise VariableError(f"the secrets file {path} cannot be read ({reason})",
                                f"create {path} with the secret in it, readable by the user Bastion runs as, or "
                                "correct the path") from None
        return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text

    def _input(self, input_id: str) -> str:
        variable = input_variable(input_id)
        value = self.environ.get(variable)
        if value is not None:
            return value
        raise VariableError(f"${{input:{input_id}}} is a value the client prompts for, and Bastion cannot prompt",
                            f"set {variable} in the environment Bastion starts in, or write the value "
                            "(or ${env:NAME}) in its place")


def input_variable(input_id: str) -> str:
    """The environment variable that supplies ``${input:ID}``: BASTION_INPUT_ and the id in capitals."""
    return "BASTION_INPUT_" + re.sub(r"[^A-Za-z0-9]", "_", input_id).upper()


def workspace_folder(file: Path) -> Path:
    """The folder a client file belongs to: the project of ``.vscode/mcp.json`` or ``.cursor/mcp.json``, else its own."""
    folder = file.resolve().parent
    return folder.parent if folder.name in (".vscode", ".cursor") else folder


def read_dotenv(path: Path) -> dict[str, str]:
    """The variables of a dotenv file: NAME=value lines, ``export`` allowed, quotes removed, ``#`` comments."""
    variables: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        name, equals, value = line.partition("=")
        name = name.strip()
        if not equals or not _PLAIN_NAME.fullmatch(name):
            raise ValueError(f"line {number} is not NAME=value")
        variables[name] = _dotenv_value(value.strip())
    return variables


def _dotenv_value(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        inner = value[1:-1]
        return inner.replace("\\n", "\n").replace('\\"', '"') if value[0] == '"' else inner
    comment = value.find(" #")
    return value[:comment].rstrip() if comment >= 0 else value
