"""The console's ASGI app, under ``/admin``: routing, login and logout, sessions, Cedar's decision on every read and
act, the CSRF and Origin checks of every POST, the audit of every act (allowed or refused), and the answers' headers.

Routes: ``GET /admin`` (the first page), ``GET /admin/PAGE``, ``GET|POST /admin/login``, ``POST /admin/logout``,
``POST /admin/act/NAME``, ``GET /admin/feed/PATH`` (JSON), ``GET /admin/static/NAME``. A GET changes nothing."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Protocol
from urllib.parse import parse_qsl, urlsplit

import orjson

from bastion.console.layout import SECURITY_HEADERS, document
from bastion.console.login import Login, LoginRefused, Presented
from bastion.console.markup import Html, join, tag
from bastion.console.registry import Act, ActRequest, BadForm, Console, Outcome, View
from bastion.console.sessions import Session, Sessions, cookie_of, set_cookie
from bastion.model import Identity
from bastion.policy.decision import Decision

log = logging.getLogger("bastion.console")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PREFIX = "/admin"
SESSION_SECONDS = 8 * 3600.0
MAX_FORM_BYTES = 64 * 1024
MAX_FIELDS = 64
FORM_SECONDS = 30


class Authorizer(Protocol):
    """Cedar's decision on operating the gateway and the audit of each act: ``PolicyRuntime``."""

    def authorize_admin(self, identity: Identity, action: str, operation: str = "") -> Decision: ...

    def record_admin_action(self, identity: Identity, operation: str, target: str | None, decision: Decision,
                            outcome: int = 0) -> None: ...


class Refused(Exception):
    """A request answered with a page saying why (403, 400, 404, 405, 413, 415)."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # below /admin, without the leading slash: "servers", "act/retry_server", ""
    query: Mapping[str, str]
    headers: Mapping[str, str]
    peer: str
    site: tuple[str, str]  # the scheme and host[:port] the browser addressed (behind trusted proxies, theirs)
    certificate: Mapping[str, Any] | None

    @property
    def secure(self) -> bool:
        """Reached over TLS (directly, or at a trusted proxy in front)."""
        return self.site[0] == "https"

    @staticmethod
    def of(scope: Scope, headers: Mapping[str, str], peer: str, site: tuple[str, str]) -> "Request":
        path = scope["path"][len(PREFIX):].strip("/")
        try:
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), max_num_fields=MAX_FIELDS))
        except ValueError:
            raise Refused(400, f"the query has more than {MAX_FIELDS} fields") from None
        return Request(scope["method"], path, query, headers, peer, site, scope.get("bastion.peer_certificate"))


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class ConsoleApp:
    """Serves ``console``'s pages and acts to the identities Cedar lets read and act; ``authorizer`` None (the
    policy is off) refuses everyone, since nobody could decide."""

    def __init__(self, console: Console, login: Login, authorizer: Authorizer | None, data: Any,
                 *, session_seconds: float = SESSION_SECONDS) -> None:
        self.console, self.login, self.authorizer, self.data = console, login, authorizer, data
        self.sessions = Sessions(session_seconds)
        self._session_seconds = session_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send, *, headers: Mapping[str, str],
                       peer: str, site: tuple[str, str]) -> None:
        session = self.sessions.find(cookie_of(headers.get("cookie")))
        if session is not None and not await self.login.still(
                session.admitted, Presented(headers, peer, scope.get("bastion.peer_certificate"))):
            log.info("console: ended the session of %s: its login no longer holds", session.identity.describe())
            self.sessions.end(session.id)
            session = None
        try:
            await self._route(Request.of(scope, headers, peer, site), session, receive, send)
        except Refused as refusal:
            await self._refusal_page(send, refusal, session)

    async def _route(self, request: Request, session: Session | None, receive: Receive, send: Send) -> None:
        path, method = request.path, request.method
        if path.startswith("static/"):
            self._only(method, "GET", "HEAD")
            await self._asset(send, path[len("static/"):])
        elif path == "login":
            self._only(method, "GET", "POST")
            if method == "GET":
                await self._page(send, 200, "Log in", self.login.form(request.query))
            else:
                await self._log_in(request, receive, send)
        elif path == "logout":
            self._only(method, "POST")
            await self._log_out(request, session, receive, send)
        elif path.startswith("act/"):
            self._only(method, "POST")
            await self._act(request, session, path[len("act/"):], receive, send)
        elif path.startswith("feed/"):
            self._only(method, "GET", "HEAD")
            await self._feed(request, session, path[len("feed/"):], send)
        else:
            self._only(method, "GET", "HEAD")
            await self._read(request, session, path or self.console.home, send)

    # ------------------------------------------------------------------------------------------ reads
    async def _read(self, request: Request, session: Session | None, path: str, send: Send) -> None:
        page = self.console.page_by_path.get(path)
        if page is None:
            raise Refused(404, f"the console has no page {path!r}")
        if session is None:
            await _redirect(send, "/admin/login")
            return
        self._decide(session.identity, "view_console", "", path)
        view = View(session.identity, request.query, self.data, session.csrf, page.path)
        try:
            body = await page.render(view)
        except Exception as error:  # noqa: BLE001 - a page that cannot be shown is said; the gateway goes on
            log.exception("console: the page %s failed", page.path)
            raise Refused(500, f"this page could not be shown: {type(error).__name__}: {error}") from None
        await self._page(send, 200, page.title, body, session=session, current=page.path,
                         notice=session.notice)
        session.notice = None

    async def _feed(self, request: Request, session: Session | None, path: str, send: Send) -> None:
        feed = self.console.feed_by_path.get(path)
        if feed is None:
            raise Refused(404, f"the console has no feed {path!r}")
        if session is None:
            raise Refused(403, "log in first: this feed needs a console session")
        self._decide(session.identity, "view_console", "", f"feed/{path}")
        try:
            body = orjson.dumps(await feed.read(View(session.identity, request.query, self.data, session.csrf, path)))
        except Exception as error:  # noqa: BLE001 - a feed that cannot be read is said; the gateway goes on
            log.exception("console: the feed %s failed", path)
            body = orjson.dumps({"error": f"this feed could not be read: {type(error).__name__}: {error}"})
            await _answer(send, 500, b"application/json", body)
            return
        await _answer(send, 200, b"application/json", body)

    # ------------------------------------------------------------------------------------------ log in, log out
    async def _log_in(self, request: Request, receive: Receive, send: Send) -> None:
        self._same_origin(request)
        form = await _read_form(request, receive)
        try:
            admitted = await self.login.identity(form, Presented(request.headers, request.peer, request.certificate))
        except LoginRefused as refusal:
            log.info("console: refused a login from %s: %s", request.peer, refusal)
            # join keeps both parts markup: str + Html is a plain str, which the layout would escape
            await self._page(send, 403, "Log in", join([tag("p", str(refusal), class_="notice refused"),
                                                        self.login.form({})]))
            return
        # Only who may read the console gets a session; a refusal here is audited like any other.
        self._decide(admitted.identity, "view_console", "", "login")
        session = self.sessions.open(admitted)
        log.info("console: %s logged in from %s", admitted.identity.describe(), request.peer)
        await _redirect(send, f"/admin/{self.console.home}",
                        ((b"set-cookie", set_cookie(session, secure=request.secure, lifetime=self._session_seconds)),))

    async def _log_out(self, request: Request, session: Session | None, receive: Receive, send: Send) -> None:
        self._same_origin(request)
        form = await _read_form(request, receive)
        if session is not None and session.csrf_matches(form.get("csrf")):
            self.sessions.end(session.id)
        await _redirect(send, "/admin/login",
                        ((b"set-cookie", set_cookie(None, secure=request.secure, lifetime=0)),))

    # ------------------------------------------------------------------------------------------ acts
    async def _act(self, request: Request, session: Session | None, name: str, receive: Receive, send: Send) -> None:
        act = self.console.act_by_name.get(name)
        if act is None:
            raise Refused(404, f"the console has no act {name!r}")
        if session is None:
            raise Refused(403, "log in first: this act needs a console session")
        try:
            self._same_origin(request)
            form = await _read_form(request, receive)
            if not session.csrf_matches(form.get("csrf")):
                raise Refused(403, "the form's CSRF token is missing or wrong: reload the page and try again")
        except Refused as refusal:
            self._audit(session.identity, act.name, None, Decision.deny("console.csrf", refusal.message),
                        refusal.status)
            raise
        back = form.get("back", "")
        fields = {k: v for k, v in form.items() if k not in ("csrf", "back")}
        target = _target(act, fields)
        decision = self._decide(session.identity, "administer", act.name, target)
        outcome = await self._run(act, ActRequest(session.identity, fields, self.data))
        self._audit(session.identity, act.name, target, decision, outcome.status)
        session.notice = (outcome.message, outcome.done)
        await _redirect(send, f"/admin/{back if back in self.console.page_by_path else self.console.home}")

    async def _run(self, act: Act, request: ActRequest) -> Outcome:
        try:
            return await act.run(request)
        except BadForm as bad:
            return Outcome(str(bad), 400)
        except Exception as error:  # noqa: BLE001 - an act that fails is said and audited; the gateway goes on
            log.exception("console: the act %s failed", act.name)
            return Outcome(f"{act.name} failed: {type(error).__name__}: {error}", 500)

    # ------------------------------------------------------------------------------------------ the checks
    def _decide(self, identity: Identity, action: str, operation: str, target: str | None) -> Decision:
        """Cedar's decision; a refusal is audited and answered 403."""
        if self.authorizer is None:
            raise Refused(403, "the policy is off (policy = \"off\"): nobody can be authorised to operate this "
                               "gateway; turn the policy on")
        decision = self.authorizer.authorize_admin(identity, action, operation)
        if not decision.allowed:
            self._audit(identity, operation or action, target, decision, 403)
            log.info("console: refused %s to %s (%s)", operation or action, identity.describe(), decision.rule)
            raise Refused(403, f"{identity.name} may not {_said(action, operation)}: {decision.reason} "
                               f"(rule {decision.rule or 'default'})")
        return decision

    def _audit(self, identity: Identity, operation: str, target: str | None, decision: Decision, outcome: int) -> None:
        if self.authorizer is not None:
            self.authorizer.record_admin_action(identity, operation, target, decision, outcome)

    @staticmethod
    def _same_origin(request: Request) -> None:
        """A POST must come from the console's own pages: a browser says where from (Sec-Fetch-Site, Origin); a
        request from another site is refused before its form is read. A client that says neither (not a browser)
        still needs the session's CSRF token."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            raise Refused(403, f"a console form must be sent from the console's own pages (Sec-Fetch-Site: {site})")
        origin = request.headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin.strip().lower())
            if (parts.scheme, _without_default_port(parts.scheme, parts.netloc)) != \
                    (request.site[0], _without_default_port(*request.site)):
                raise Refused(403, "a console form must be sent from the console's own pages (the Origin is another "
                                   "site)")

    @staticmethod
    def _only(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise Refused(405, f"{method} is not used here ({', '.join(allowed)})",
                          ((b"allow", ", ".join(allowed).encode()),))

    # ------------------------------------------------------------------------------------------ answers
    def _menu(self) -> list[tuple[str, str]]:
        return [(page.path, page.title) for page in self.console.pages if page.in_menu]

    async def _page(self, send: Send, status: int, title: str, body: Html, *, session: Session | None = None,
                    current: str = "", notice: tuple[str, bool] | None = None,
                    headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        page = document(title, body, menu=self._menu() if session is not None else (), current=current,
                        who=session.identity if session else None, csrf=session.csrf if session else None,
                        notice=notice)
        await _answer(send, status, b"text/html; charset=utf-8", page, headers)

    async def _refusal_page(self, send: Send, refusal: Refused, session: Session | None) -> None:
        title = {403: "Refused", 404: "Not found", 405: "Not allowed", 500: "Failed"}.get(refusal.status, "Bad request")
        await self._page(send, refusal.status, title, tag("p", refusal.message, class_="notice refused"),
                         session=session, headers=refusal.headers)

    async def _asset(self, send: Send, name: str) -> None:
        found = self.console.asset_by_name.get(name)
        if found is None:
            raise Refused(404, f"no file {name!r}")
        await _answer(send, 200, found.content_type.encode(), found.body)


def _without_default_port(scheme: str, netloc: str) -> str:
    default = {"http": ":80", "https": ":443"}.get(scheme)
    return netloc[: -len(default)] if default and netloc.endswith(default) else netloc


def _target(act: Act, form: Mapping[str, str]) -> str | None:
    try:
        return act.target(form)
    except (KeyError, ValueError, BadForm):
        return None


def _said(action: str, operation: str) -> str:
    return {"view_console": "read the console"}.get(action, f"do {operation!r} from the console")


async def _read_form(request: Request, receive: Receive) -> dict[str, str]:
    """The POSTed form (application/x-www-form-urlencoded), bounded in size and fields; a field given twice keeps
    its first value."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(415, "a console form is sent as application/x-www-form-urlencoded")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(FORM_SECONDS):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Refused(400, "the browser left while sending the form")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > MAX_FORM_BYTES:
                    raise Refused(413, f"the form is over {MAX_FORM_BYTES} bytes")
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
    except TimeoutError:
        raise Refused(408, f"the form did not arrive within {FORM_SECONDS} s") from None
    try:
        pairs = parse_qsl(b"".join(chunks).decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FIELDS,
                          strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "the form is not UTF-8 form data, or has too many fields") from None
    form: dict[str, str] = {}
    for key, value in pairs:
        form.setdefault(key, value)
    return form


async def _answer(send: Send, status: int, kind: bytes, body: bytes,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    try:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", kind), (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS, *headers]})
        await send({"type": "http.response.body", "body": body})
    except OSError:
        pass


async def _redirect(send: Send, location: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await _answer(send, 303, b"text/plain; charset=utf-8", b"", ((b"location", location.encode()), *headers))
