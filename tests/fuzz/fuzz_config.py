"""The configuration loader (``load_config``: Bastion's TOML and JSON, and the client dialects it reads directly:
Claude Desktop's and Cursor's ``mcpServers``, VS Code's ``servers`` with ``type`` and ``inputs``) and the import of
clients' files (``read_client_file``, JSON with comments, then ``convert_entry``).

Oracle: loading gives a configuration or raises ``ConfigError`` only, whose message begins with the file's path
and whose findings each name a key; reading a client's file never raises (a problem names the file), and
converting each of its entries gives Bastion's entry or a sentence naming the server, never an exception."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import atheris
import orjson
import tomli_w

from bastion.clients.discovery import read_client_file
from bastion.clients.importer import convert_entry
from bastion.config import ConfigError, GatewayConfig, load_config
from tests.fuzz.common import json_value

NAMES = ["bastion.toml", "bastion.json", "claude_desktop_config.json", ".cursor/mcp.json", ".vscode/mcp.json",
         "settings.json", "mcp"]
ENTRY_KEYS = ["command", "args", "env", "envFile", "cwd", "url", "serverUrl", "type", "transportType", "headers",
              "disabled", "autoApprove", "alwaysAllow", "enabled", "sandbox", "timeout", "era", "auth", "tools"]
TOP_KEYS = ["mcpServers", "servers", "inputs", "policy", "guardrails", "http", "tools", "mcp", "projects", "log"]
TEXTS = ["node", "npx", "${workspaceFolder}/x", "${env:HOME}", "${input:key}", "$HOME/a", "~/b", "stdio", "sse",
         "http", "https://example.com/mcp", "http://10.0.0.1/", "${userHome}", "${file}", "-y", "off"]
_place: dict[str, Path] = {}


def setup() -> None:
    top = Path(tempfile.mkdtemp(prefix="bastion-fuzz-config-"))  # under the caller's TMPDIR, which it removes
    os.environ["XDG_STATE_HOME"] = str(top / "state")  # inferred grants name a memory folder under it
    os.environ["XDG_CONFIG_HOME"] = str(top / "config")
    for name in NAMES:
        (top / "work" / name).parent.mkdir(parents=True, exist_ok=True)
    _place["top"] = top / "work"


def _value(fdp: atheris.FuzzedDataProvider) -> Any:
    return fdp.PickValueInList(TEXTS) if fdp.ConsumeBool() else json_value(fdp, 3)


def _entry(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        key = fdp.PickValueInList(ENTRY_KEYS)
        pick = fdp.ConsumeIntInRange(0, 3)
        entry[key] = (_value(fdp) if pick == 0 else [_value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 3))]
                      if pick == 1 else {fdp.PickValueInList(TEXTS): _value(fdp)} if pick == 2 else json_value(fdp, 4))
    return entry


def _document(fdp: atheris.FuzzedDataProvider) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        key = fdp.PickValueInList(TOP_KEYS)
        if key in ("mcpServers", "servers") and fdp.ConsumeIntInRange(0, 4):
            document[key] = {fdp.PickValueInList(["a", "b", "fs", ""]): _entry(fdp)
                             for _ in range(fdp.ConsumeIntInRange(0, 3))}
        else:
            document[key] = json_value(fdp, 2)
    return document


def _bytes(fdp: atheris.FuzzedDataProvider, name: str) -> bytes:
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        return fdp.ConsumeBytes(fdp.remaining_bytes())
    document = _document(fdp)
    if name.endswith(".toml") and kind != 3:
        try:
            return tomli_w.dumps(_tomlable(document)).encode()
        except (TypeError, ValueError):
            return b""
    text = orjson.dumps(document, option=orjson.OPT_INDENT_2)
    if kind == 3 and text.endswith(b"}"):  # what VS Code's files allow: comments and a trailing comma
        text = b"// servers\n" + text[:-1] + b",/* end */}"
    return text


def _tomlable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tomlable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_tomlable(v) for v in value if v is not None]
    return value


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    name = fdp.PickValueInList(NAMES)
    file = _place["top"] / name
    file.write_bytes(_bytes(fdp, name))
    try:
        config = load_config(file, log_notes=False)
    except ConfigError as error:
        assert str(error).startswith(f"{file}: "), str(error)
        for finding in error.findings:
            assert finding.where and finding.message and finding.fix is not None, finding
    else:
        assert isinstance(config, GatewayConfig)
    found = read_client_file(file, "client", _place["top"], expect_servers=False)
    for problem in found.problems:
        assert problem.startswith(f"{file}: "), problem
    for server in found.servers:
        converted = convert_entry(server, home=_place["top"], environ={"HOME": "/home/u"})
        if isinstance(converted, str):
            assert repr(server.name) in converted, converted
        else:
            entry, notes = converted
            assert isinstance(entry, dict) and all(isinstance(n, str) for n in notes)
