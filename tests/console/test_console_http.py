"""The web console on a real ``bastion serve --http`` with API keys: an admin logs in with a key and reads the servers
page (hostile stderr escaped, the strict headers on every answer); a non-admin is refused with 403 and the refusal
is audited; an act posted without the session's CSRF token, with a wrong one, or from another site is refused,
audited and changes nothing; the same act posted properly retries a failed server, which comes back."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.auth.serving import start, stop
from tests.console.support import POLICY, Browser, admin_records, base_of, gate_server, serve_with_keys
from tests.support import BASTION, READY_TIMEOUT

pytestmark = pytest.mark.slow

DEADLINE = 120
# A file name a browser would run as markup if the console wrote a server's stderr unescaped.
HOSTILE = '<img src=x onerror="alert(1)">'


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of this test's own: its gateway's status file is the only one the console could show."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def _failed_after_giving_up(text: str) -> bool:
    return "failed" in text and "when asked" in text


async def _until(browser: Browser, path: str, predicate) -> httpx2.Response:
    """The page once ``predicate`` holds of its text (the gateway's status file is rewritten as servers change)."""
    while True:
        response = await browser.page(path)
        if predicate(response.text):
            return response
        await asyncio.sleep(0.1)


async def test_admin_reads_the_servers_page_and_a_non_admin_is_refused_and_audited(tmp_path, state) -> None:
    missing = tmp_path / HOSTILE
    served, admin, guest = serve_with_keys(tmp_path, {"steady": gate_server("steady"),
                                                      "crashy": gate_server("crashy", START_CRASH_UNLESS=str(missing))})
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                # Not logged in: the pages send the browser to the login form
                first = await browser.page("/admin/servers")
                assert first.status_code == 303 and first.headers["location"] == "/admin/login"
                login_form = await browser.page("/admin/login")
                assert login_form.status_code == 200 and 'name="credential"' in login_form.text

                wrong = await Browser(httpx2.AsyncClient(), browser.base).login("bst_not-a-key")
                assert wrong.status_code in (401, 403) and "set-cookie" not in wrong.headers

                logged_in = await browser.login(admin)
                assert logged_in.status_code == 303, logged_in.text
                cookie = logged_in.headers["set-cookie"]
                assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/admin" in cookie
                assert admin not in cookie

                page = await _until(browser, "/admin/servers", _failed_after_giving_up)
                assert page.status_code == 200
                headers = page.headers
                assert "default-src 'none'" in headers["content-security-policy"]
                assert "frame-ancestors 'none'" in headers["content-security-policy"]
                assert headers["x-frame-options"] == "DENY" and "no-store" in headers["cache-control"]
                # a browser sends its Origin with the console's forms (no-referrer would make it "null")
                assert headers["referrer-policy"] == "same-origin"
                assert "steady" in page.text and "crashy" in page.text and "status-ready" in page.text
                assert "settings file missing" in page.text
                assert HOSTILE not in page.text and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page.text
                assert "ada" in page.text and browser.csrf

                # The same as JSON, for a page that watches: with the session only
                feed = await client.get(browser.base + "/admin/feed/servers")
                assert feed.status_code == 200 and feed.headers["content-type"] == "application/json"
                [mine] = feed.json()
                assert mine["servers"]["crashy"]["status"] == "failed" and mine["servers"]["steady"]["status"] == "ready"
                assert (await httpx2.AsyncClient().get(browser.base + "/admin/feed/servers")).status_code == 403

                # A non-admin: its login is refused with 403, and the refusal is in the audit trail
                async with httpx2.AsyncClient(timeout=60) as other:
                    guest_browser = Browser(other, browser.base)
                    refused = await guest_browser.login(guest)
                    assert refused.status_code == 403 and "gus may not read the console" in refused.text
                    assert "set-cookie" not in refused.headers
                    assert (await guest_browser.page("/admin/servers")).status_code == 303

                # Logging out ends the session: its cookie opens nothing any more
                session_cookie = {"cookie": cookie.split(";", 1)[0]}
                assert (await browser.post("/admin/logout", {"csrf": browser.csrf})).status_code == 303
                after = await httpx2.AsyncClient().get(browser.base + "/admin/servers", headers=session_cookie)
                assert after.status_code == 303 and after.headers["location"] == "/admin/login"
    finally:
        stop(served)
    records = admin_records(tmp_path)
    assert any(r["who"]["name"] == "gus" and r["what"]["method"] == "admin/view_console" for r in records), records
    assert not any(r["who"]["name"] == "ada" for r in records)  # reads that are allowed are not acts


async def test_an_act_needs_the_sessions_csrf_token_and_the_consoles_own_origin(tmp_path, state) -> None:
    flags = tmp_path / "flags"
    fixed = flags / "settings.toml"
    served, admin, _ = serve_with_keys(tmp_path, {"crashy": gate_server("crashy", flags,
                                                                        START_CRASH_UNLESS=str(fixed))})
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                assert (await browser.login(admin)).status_code == 303
                await _until(browser, "/admin/servers", _failed_after_giving_up)
                fixed.write_text("fixed")  # from here a retry would bring it back: each refusal below must not

                attempts = [
                    await browser.act("retry_server", {"server": "crashy"}, csrf=""),  # no token
                    await browser.act("retry_server", {"server": "crashy"}, csrf="forged-token"),
                    await browser.act("retry_server", {"server": "crashy"}, headers={"origin": "http://evil.example"}),
                    await browser.act("retry_server", {"server": "crashy"}, headers={"sec-fetch-site": "cross-site"}),
                    # a page served by another program on this machine passes the gateway's DNS-rebinding guard (a
                    # loopback origin to a loopback gateway), not the console's own check
                    await browser.act("retry_server", {"server": "crashy"}, headers={"origin": "http://127.0.0.1:9"}),
                ]
                assert [a.status_code for a in attempts] == [403] * 5, [a.text for a in attempts]
                assert "Sec-Fetch-Site: cross-site" in attempts[3].text and "Origin is another site" in attempts[4].text
                assert "CSRF token" in attempts[0].text and "CSRF token" in attempts[1].text
                # a GET of an act changes nothing either
                assert (await client.get(browser.base + "/admin/act/retry_server?server=crashy")).status_code == 405
                still = await browser.page("/admin/servers")
                assert _failed_after_giving_up(still.text)
                assert "starting it again" not in served.log()

                done = await browser.act("retry_server", {"server": "crashy"})
                assert done.status_code == 303 and done.headers["location"] == "/admin/servers"
                said = await _until(browser, "/admin/servers", lambda text: "status-ready" in text or "notice" in text)
                assert "start crashy again" in said.text
                await _until(browser, "/admin/servers", lambda text: "status-ready" in text and "status-failed" not in text)
    finally:
        stop(served)
    assert "as `bastion servers retry` asked" in served.log()
    # Every refusal the console made is audited with the act itself: the missing and the forged token, the
    # cross-site fetch, the other origin (the evil.example one is refused before the console, by the gateway's own
    # Origin guard), and the retry, done.
    outcomes = sorted(r["outcome"] for r in admin_records(tmp_path) if r["what"]["method"] == "admin/retry_server")
    assert outcomes == [0, 403, 403, 403, 403], outcomes


async def test_careless_and_hostile_requests_are_answered_with_clear_refusals_and_change_nothing(tmp_path,
                                                                                              state) -> None:
    served, admin, _ = serve_with_keys(tmp_path, {"steady": gate_server("steady")})
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                base = browser.base
                assert (await browser.login(admin)).status_code == 303
                await _until(browser, "/admin/servers", lambda text: "status-ready" in text)
                said = {
                    "traversal": await client.get(base + "/admin/static/../../../etc/passwd"),
                    "unknown page": await client.get(base + "/admin/%3Cscript%3E"),
                    "unknown act": await browser.act("drop_tables", {}),
                    "GET logout": await client.get(base + "/admin/logout"),
                    "JSON form": await client.post(base + "/admin/act/retry_server", json={"server": "steady"},
                                                   headers={"origin": base}),
                    "huge form": await browser.act("retry_server", {"server": "x" * (70 * 1024)}),
                    "many fields": await client.get(base + "/admin/servers?" + "&".join(f"f{i}=1" for i in range(100))),
                    "long field": await browser.act("retry_server", {"server": "s" * 600}),
                    "not failed": await browser.act("retry_server", {"server": "steady\nsteady"}),
                    "cross-site login": await Browser(httpx2.AsyncClient(), base).post(
                        "/admin/login", {"credential": admin}, {"sec-fetch-site": "cross-site"}),
                    "garbage cookie": await httpx2.AsyncClient().get(
                        base + "/admin/servers", headers={"cookie": "bastion_console=" + "A" * 4000}),
                }
                after = await browser.page("/admin/servers")
                # a pins file that is no pins file is said on the pages that read it, not an internal error
                (state / "bastion" / "pins.json").write_text("{not json")
                unreadable = [await browser.page("/admin/catalog"), await browser.page("/admin/changes")]
    finally:
        stop(served)
    status = {what: response.status_code for what, response in said.items()}
    assert status == {"traversal": 404, "unknown page": 404, "unknown act": 404, "GET logout": 405,
                      "JSON form": 415, "huge form": 413, "many fields": 400, "long field": 303, "not failed": 303,
                      "cross-site login": 403, "garbage cookie": 303}, status
    assert "&lt;script&gt;" in said["unknown page"].text and "<script>" not in said["unknown page"].text
    assert "set-cookie" not in said["cross-site login"].headers
    # the acts that reached their code were said and audited as not done; the gateway is as it was
    assert "status-ready" in after.text
    outcomes = sorted(r["outcome"] for r in admin_records(tmp_path) if r["what"]["method"] == "admin/retry_server")
    # the long field, the server that had not failed, the huge form, the JSON body
    assert outcomes == [400, 404, 413, 415], outcomes
    assert [page.status_code for page in unreadable] == [200, 200]
    assert all("not a pins file" in page.text for page in unreadable), [page.text for page in unreadable]
    assert "internal error" not in served.log() and "Traceback" not in served.log()


async def test_behind_a_tls_proxy_the_cookie_is_secure_and_the_origin_is_the_proxys(tmp_path, state) -> None:
    public = "gateway.example.com"
    served, admin, _ = serve_with_keys(tmp_path, {"steady": gate_server("steady")}, http={
        "trusted_proxies": ["127.0.0.1/32"], "allowed_hosts": [public],
        # both let past the gateway's own guard: the console's check is the one that refuses the plain-HTTP page
        "allowed_origins": [f"https://{public}", f"http://{public}"]})
    forwarded = {"x-forwarded-proto": "https", "x-forwarded-host": public, "x-forwarded-for": "192.0.2.7"}
    try:
        async with httpx2.AsyncClient(timeout=60, headers=forwarded) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                login = await browser.post("/admin/login", {"credential": admin}, {"origin": f"https://{public}"})
                assert login.status_code == 303, login.text
                cookie = login.headers["set-cookie"]
                assert cookie.startswith("__Host-bastion_console=") and "; Secure" in cookie and "Path=/;" in cookie
                # a TLS-only cookie: sent by hand, as the browser would over the proxy's HTTPS
                client.headers["cookie"] = cookie.split(";", 1)[0]
                await browser.page("/admin/servers")
                same = await browser.act("retry_server", {"server": "steady"}, headers={"origin": f"https://{public}"})
                plain = await browser.act("retry_server", {"server": "steady"}, headers={"origin": f"http://{public}"})
    finally:
        stop(served)
    assert same.status_code == 303  # past the checks: steady had not failed, which the page says
    assert plain.status_code == 403 and "Origin is another site" in plain.text


@pytest.mark.parametrize("policy", ["on", "off"])
async def test_without_authentication_the_configured_identity_logs_in_and_cedar_decides(tmp_path, state,
                                                                                         policy) -> None:
    (tmp_path / "team.cedar").write_text(POLICY)
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"steady": gate_server("steady")}, "ready_timeout": READY_TIMEOUT,
        "policy": "off" if policy == "off" else {
            "policy_files": ["team.cedar"], "identity": {"name": "ops", "groups": ["admins"]},
            "audit": {"path": str(tmp_path / "audit.jsonl")}}}))
    served = start(config)
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                form = await browser.page("/admin/login")
                login = await browser.login("")
                page = await browser.page("/admin/servers")
    finally:
        stop(served)
    if policy == "on":
        assert "you log in as its configured identity, ops" in form.text
        assert login.status_code == 303 and page.status_code == 200 and "ops (configured)" in page.text
    else:  # nobody to decide: nobody operates
        assert login.status_code == 403 and "the policy is off" in login.text and "set-cookie" not in login.headers


async def test_a_session_ends_when_the_key_it_logged_in_with_is_revoked(tmp_path, state) -> None:
    served, admin, _ = serve_with_keys(tmp_path, {"steady": gate_server("steady")})
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                assert (await browser.login(admin)).status_code == 303
                assert (await browser.page("/admin/servers")).status_code == 200
                revoked = await anyio.to_thread.run_sync(lambda: subprocess.run(
                    [BASTION, "keys", "revoke", "ada", "--file", str(tmp_path / "keys.json")], capture_output=True,
                    text=True, timeout=60))
                assert revoked.returncode == 0, revoked.stderr
                # the gateway reads the key file again within a second; from then on the session is over
                while (page := await browser.page("/admin/servers")).status_code == 200:
                    await asyncio.sleep(0.1)
                assert page.status_code == 303 and page.headers["location"] == "/admin/login"
                assert (await browser.act("retry_server", {"server": "steady"})).status_code == 403
    finally:
        stop(served)
    assert "ended the session of ada" in served.log()


async def test_a_reload_from_the_console_applies_the_file_and_the_next_decision_is_the_new_policys(tmp_path,
                                                                                                  state) -> None:
    served, admin, _ = serve_with_keys(tmp_path, {"steady": gate_server("steady")})
    config = tmp_path / "bastion.json"
    try:
        async with httpx2.AsyncClient(timeout=60) as client:
            with anyio.fail_after(DEADLINE):
                browser = Browser(client, base_of(served))
                assert (await browser.login(admin)).status_code == 303
                page = await _until(browser, "/admin/servers", lambda text: "status-ready" in text)
                assert 'value="reload"' in page.text or "/admin/act/reload" in page.text
                pid = served.process.pid
                # A careless form: not a process id, another gateway's
                assert (await browser.act("reload", {"gateway": "../1"})).status_code == 303
                refused = await browser.page("/admin/servers")
                assert "must be a process id" in refused.text

                body = json.loads(config.read_text())
                body["servers"]["second"] = gate_server("second")
                body["reload"] = {"watch": False}  # only the act reloads, not the file watch
                config.write_text(json.dumps(body))
                done = await browser.act("reload", {"gateway": str(pid)})
                assert done.status_code == 303
                said = await browser.page("/admin/servers")
                assert "reloaded: servers added: second" in said.text, said.text
                await _until(browser, "/admin/servers", lambda text: text.count("status-ready") == 2)

                # The policy swapped by a reload decides the console's next request: without the operators' rule
                # the admin is refused at once.
                (tmp_path / "team.cedar").write_text(POLICY.replace("default-admins-operate", "operators").replace(
                    'action in [Bastion::Action::"view_metrics", Bastion::Action::"view_console", '
                    'Bastion::Action::"administer"]', 'action == Bastion::Action::"administer"'))
                assert (await browser.act("reload", {"gateway": str(pid)})).status_code == 303
                assert (await browser.page("/admin/servers")).status_code == 403
    finally:
        stop(served)
    reloads = [r for r in admin_records(tmp_path) if r["what"]["method"] == "admin/reload"]
    # Each act is recorded (on the gateway it asked; the careless form's refused), and each reload it made (on the
    # file read again), both under the operator
    assert [r["who"]["name"] for r in reloads] == ["ada"] * 5, reloads
    targets = [(r["what"]["target"], r["outcome"]) for r in reloads]
    assert targets.count((str(config), 0)) == 2 and targets.count((f"gateway {served.process.pid}", 0)) == 2, targets
    assert ("gateway ../1", 400) in targets, targets
