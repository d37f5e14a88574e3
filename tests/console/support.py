"""What the console's tests share: a real ``bastion serve --http`` with API keys of an admin and of a non-admin, and
a small browser over httpx2 that keeps the session cookie, reads a page's CSRF token and posts an act's form as a
page of the console would (Origin and Sec-Fetch-Site as a browser sends them)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2

from tests.auth.serving import Served, start
from tests.support import BASTION, FIXTURES, READY_TIMEOUT

GATE_SERVER = str(FIXTURES / "start_gate_server.py")

# Everyone may list and call, with no approvals asked; group admins operate the gateway (the default policy's rule)
POLICY = """
@id("default-admins-operate")
permit (
  principal in Bastion::Group::"admins",
  action in [Bastion::Action::"view_metrics", Bastion::Action::"view_console", Bastion::Action::"administer"],
  resource
);

@id("anyone-lists")
permit (principal, action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources",
                              Bastion::Action::"list_prompts"], resource);

@id("anyone-calls")
permit (principal, action == Bastion::Action::"call_tool", resource);
"""


def make_key(file: Path, name: str, *args: str) -> str:
    made = subprocess.run([BASTION, "keys", "create", name, "--file", str(file), *args], capture_output=True,
                          text=True, timeout=120, check=True)
    return made.stdout.strip()


def gate_server(name: str, flags: Path | None = None, **env: str) -> dict[str, Any]:
    """The start-gate fixture server named ``name`` (``START_CRASH_UNLESS`` etc. in ``env``); ``flags``, the folder
    of its flag files, is made visible in its sandbox."""
    entry: dict[str, Any] = {"command": sys.executable, "args": [GATE_SERVER], "env": {"START_NAME": name, **env}}
    if flags is not None:
        flags.mkdir(exist_ok=True)
        entry["sandbox"] = {"writable": [str(flags)]}
    return entry


def console_config(tmp: Path, servers: dict[str, Any], **extra: Any) -> Path:
    (tmp / "team.cedar").write_text(POLICY)
    config = {"servers": servers, "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
              "policy": {"policy_files": ["team.cedar"],
                         "audit": {"path": str(tmp / "audit.jsonl")}},
              "auth": {"api_keys": "keys.json"}, **extra}
    path = tmp / "bastion.json"
    path.write_text(json.dumps(config))
    return path


def serve_with_keys(tmp: Path, servers: dict[str, Any], **extra: Any) -> tuple[Served, str, str]:
    """A gateway, an admin's key (group admins) and a non-admin's key."""
    keys = tmp / "keys.json"
    admin = make_key(keys, "ada", "--groups", "admins")
    guest = make_key(keys, "gus", "--groups", "staff")
    return start(console_config(tmp, servers, **extra)), admin, guest


def base_of(served: Served) -> str:
    return served.url.removesuffix("/mcp")


CSRF = re.compile(r'name="csrf" value="([^"]*)"')


class Browser:
    """One browser's view of the console: its cookie jar, and forms sent the way a page sends them."""

    def __init__(self, client: httpx2.AsyncClient, base: str) -> None:
        self.client, self.base = client, base
        self.csrf = ""

    @property
    def origin(self) -> str:
        return self.base

    async def login(self, credential: str = "") -> httpx2.Response:
        return await self.post("/admin/login", {"credential": credential})

    async def page(self, path: str) -> httpx2.Response:
        response = await self.client.get(self.base + path)
        found = CSRF.search(response.text)
        if found:
            self.csrf = html.unescape(found.group(1))
        return response

    async def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None) -> httpx2.Response:
        sent = {"origin": self.origin, "sec-fetch-site": "same-origin", **(headers or {})}
        return await self.client.post(self.base + path, data=form, headers={k: v for k, v in sent.items() if v})

    async def act(self, name: str, fields: dict[str, str], *, back: str = "servers",
                  headers: dict[str, str] | None = None, csrf: str | None = None) -> httpx2.Response:
        form = {**fields, "back": back, "csrf": self.csrf if csrf is None else csrf}
        return await self.post(f"/admin/act/{name}", {k: v for k, v in form.items() if v is not None}, headers)


def audit_records(tmp: Path) -> list[dict[str, Any]]:
    """Every record of the trail's files in ``tmp`` (the gateway's chain and others')."""
    records = []
    for path in sorted(tmp.glob("audit*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def admin_records(tmp: Path) -> list[dict[str, Any]]:
    """The ``call`` records of operators' acts (and refusals): ``what.method`` is ``admin/OPERATION``."""
    return [r for r in audit_records(tmp)
            if r.get("kind") == "call" and str(r.get("what", {}).get("method", "")).startswith("admin/")]
