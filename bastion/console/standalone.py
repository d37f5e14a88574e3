"""``bastion console``: the web console in a process of its own, beside gateways a client started on stdio, served
on loopback only. It reads what they write to disk (``data.py``); who may use it is whoever opens the one-time login
link it printed; what it may do, Cedar decides for the identity ``console_identity`` names, and the configuration's
audit trail records it."""

from __future__ import annotations

from bastion.console.app import ConsoleApp, Receive, Scope, Send, is_console_path
from bastion.model import Identity

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
CONSOLE_GROUP = "admins"
AUTHENTICATED_BY = "console_link"


def console_identity(configured: Identity) -> Identity:
    """Who the console acts as: the configuration's own identity (the one its stdio gateways call as, so the audit
    names the same person), in group ``admins`` besides its own groups. Whoever can read the login link can read
    this user's files, the pins and the trail already: the link adds no power the user lacks. Cedar still decides
    every act, and a policy may narrow it by ``principal.authenticated_by == "console_link"``."""
    groups = configured.groups if CONSOLE_GROUP in configured.groups else (*configured.groups, CONSOLE_GROUP)
    return Identity(configured.name, tuple(groups), AUTHENTICATED_BY)


def host_of(value: str) -> str:
    """The host of a Host header, without its port (an IPv6 literal keeps its brackets)."""
    if value.startswith("["):
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class LoopbackConsole:
    """The ASGI app of ``bastion console``: the console under ``/admin``, for requests that name this machine in
    their Host (a page on another site that rebinds a name of its own to 127.0.0.1 is refused); nothing else."""

    def __init__(self, console: ConsoleApp) -> None:
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # uvicorn runs it with lifespan="off": only requests come
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1").strip() for k, v in scope.get("headers", ())}
        if host_of(headers.get("host", "").lower()) not in LOOPBACK_HOSTS:
            await _plain(send, 403, b"bastion console answers to 127.0.0.1, localhost or [::1] only")
        elif is_console_path(scope["path"]):
            peer = (scope.get("client") or ("", 0))[0]
            await self.console(scope, receive, send, headers=headers, peer=peer,
                               site=("http", headers.get("host", "").lower()))
        elif scope["path"] == "/":
            await _plain(send, 303, b"", ((b"location", b"/admin/login"),))
        else:
            await _plain(send, 404, b"nothing here: the console is at /admin")


async def _plain(send: Send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"), *headers]})
    await send({"type": "http.response.body", "body": body})

