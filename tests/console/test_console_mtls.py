"""Logging in to the console with a client certificate: over HTTPS with mutual TLS, a browser whose certificate maps to
an admin logs in with the form left empty and gets a Secure ``__Host-`` cookie; one whose certificate maps to someone
else is refused and audited."""

from __future__ import annotations

import json

import anyio
import pytest

from tests.auth.serving import start, stop
from tests.auth.test_mtls_end_to_end import Pki
from tests.console.support import POLICY, Browser, admin_records, base_of, gate_server
from tests.support import READY_TIMEOUT

pytestmark = pytest.mark.slow


async def test_a_browser_logs_in_with_its_client_certificate(tmp_path) -> None:
    pki = Pki(tmp_path)
    (tmp_path / "team.cedar").write_text(POLICY)
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({
        "servers": {"steady": gate_server("steady")}, "ready_timeout": READY_TIMEOUT, "http": pki.http(),
        "policy": {"policy_files": ["team.cedar"], "audit": {"path": str(tmp_path / "audit.jsonl")}},
        "auth": {"client_certificates": {"cn:ops-laptop": {"name": "ada", "groups": ["admins"]},
                                         "cn:intern-laptop": "ivan"}}}))
    served = start(config)
    try:
        with anyio.fail_after(120):
            async with pki.client(pki.client_ca.issue_cert("ops-laptop", common_name="ops-laptop")) as client:
                browser = Browser(client, base_of(served))
                login = await browser.login("")
                assert login.status_code == 303, login.text
                cookie = login.headers["set-cookie"]
                assert cookie.startswith("__Host-bastion_console=") and "; Secure" in cookie
                page = await browser.page("/admin/servers")
                assert page.status_code == 200 and "ada (mtls)" in page.text
            async with pki.client(pki.client_ca.issue_cert("intern-laptop", common_name="intern-laptop")) as client:
                refused = await Browser(client, base_of(served)).login("")
                assert refused.status_code == 403 and "ivan may not read the console" in refused.text
    finally:
        stop(served)
    assert [(r["who"]["name"], r["outcome"]) for r in admin_records(tmp_path)] == [("ivan", 403)]
