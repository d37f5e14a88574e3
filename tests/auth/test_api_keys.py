"""API keys: the key file ``bastion keys`` writes (hashed, 0600, atomic under a lock) and the chain method that
turns a presented key into the identity named after it."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from bastion.auth.api_keys import (ApiKeyFile, ApiKeyFileError, ApiKeyMethod, digest, parse_expiry,
                                   presented_key)
from bastion.auth.base import AuthenticatorChain, AuthFailure, Credentials
from tests.support import BASTION


def request(**headers: str) -> Credentials:
    return Credentials({k.lower().replace("_", "-"): v for k, v in headers.items()}, "mcp", "127.0.0.1")


def method_for(path: Path, **kwargs) -> ApiKeyMethod:
    method = ApiKeyMethod(ApiKeyFile(path), **kwargs)
    method.load()
    return method


def test_the_file_keeps_a_hash_never_the_key_and_only_its_owner_reads_it(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "state" / "keys.json")
    key, record = keys.create("ci", ("mcp:read", "mcp:tools"), ("ops",))
    assert key.startswith("bst_") and len(key) == 4 + 43
    text = keys.path.read_text()
    assert key not in text and key[4:] not in text
    assert record.digest == digest(key) and record.digest in text
    assert stat.S_IMODE(os.stat(keys.path).st_mode) == 0o600
    stored, _ = keys.load()
    assert stored["ci"].scopes == ("mcp:read", "mcp:tools") and stored["ci"].groups == ("ops",)
    other, _ = keys.create("ci-2")
    assert other != key  # every key is fresh randomness


def test_a_name_is_one_key_and_revoking_deletes_it(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    keys.create("ci")
    with pytest.raises(ApiKeyFileError, match="exists already: revoke it first"):
        keys.create("ci")
    assert keys.revoke("nobody") is None
    assert keys.revoke("ci").name == "ci"
    assert keys.load()[0] == {}


def test_names_and_expiry_are_checked() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_expiry("30d", now) == now + timedelta(days=30)
    assert parse_expiry("12h", now) == now + timedelta(hours=12)
    assert parse_expiry("2027-01-31", now) == datetime(2027, 1, 31, tzinfo=timezone.utc)
    for bad in ("0d", "3q", "2020-01-01", "soon"):
        with pytest.raises(ValueError):
            parse_expiry(bad, now)
    with pytest.raises(ValueError, match="not a key name"):
        ApiKeyFile(Path("/nonexistent/keys.json")).create("two words")


def test_where_a_key_is_presented() -> None:
    assert presented_key({"x-api-key": " bst_abc "}) == "bst_abc"
    assert presented_key({"authorization": "Bearer bst_abc"}) == "bst_abc"
    assert presented_key({"authorization": "bearer  bst_abc"}) == "bst_abc"
    assert presented_key({"authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.e30.sig"}) is None  # a JWT: OAuth's
    assert presented_key({"authorization": "Basic bst_abc"}) is None
    assert presented_key({}) is None


async def test_a_key_is_the_identity_named_after_it_with_its_scopes_and_groups(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    key, _ = keys.create("ci", ("mcp:tools",), ("ops", "ci"))
    method = method_for(keys.path)
    for credentials in (request(authorization=f"Bearer {key}"), request(x_api_key=key)):
        assert method.presented(credentials)
        identity = await method.authenticate(credentials)
        assert (identity.name, identity.groups, identity.authenticated_by) == ("ci", ("ops", "ci"), "api_key")
        assert identity.scopes == frozenset({"mcp:tools"}) and identity.issuer is None


async def test_unknown_tampered_and_empty_keys_are_refused_without_echoing_them(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    key, _ = keys.create("ci")
    method = method_for(keys.path)
    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    for presented in (tampered, "bst_" + "x" * 43, "", "not-a-key", key * 1000):
        with pytest.raises(AuthFailure) as refused:
            await method.authenticate(request(x_api_key=presented))
        assert refused.value.status == 401 and refused.value.error == "invalid_token"
        assert presented not in refused.value.message or not presented


async def test_an_expired_key_is_refused(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    now = datetime.now(timezone.utc)
    key, record = keys.create("short", expires=now + timedelta(hours=1), now=now)
    at = [now.timestamp()]
    method = method_for(keys.path, clock=lambda: at[0])
    assert (await method.authenticate(request(x_api_key=key))).name == "short"
    at[0] = now.timestamp() + 3601
    with pytest.raises(AuthFailure) as refused:
        await method.authenticate(request(x_api_key=key))
    assert refused.value.status == 401 and "expired" in refused.value.message


async def test_a_running_method_sees_revocations_and_new_keys(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    key, _ = keys.create("ci")
    method = method_for(keys.path, recheck_seconds=0)
    assert (await method.authenticate(request(x_api_key=key))).name == "ci"
    # another process (bastion keys) changes the file
    subprocess.run([BASTION, "keys", "revoke", "ci", "--file", str(keys.path)], check=True, capture_output=True)
    with pytest.raises(AuthFailure):
        await method.authenticate(request(x_api_key=key))
    made = subprocess.run([BASTION, "keys", "create", "new", "--file", str(keys.path)], check=True,
                          capture_output=True, text=True)
    assert (await method.authenticate(request(x_api_key=made.stdout.strip()))).name == "new"


async def test_a_broken_key_file_accepts_no_key_until_it_is_repaired(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    key, _ = keys.create("ci")
    good = keys.path.read_bytes()
    method = method_for(keys.path, recheck_seconds=0)
    keys.path.write_text("{not json")
    with pytest.raises(AuthFailure) as refused:
        await method.authenticate(request(x_api_key=key))
    assert refused.value.status == 503  # fail closed: the broken file might hold a revocation
    keys.path.write_bytes(good)
    assert (await method.authenticate(request(x_api_key=key))).name == "ci"
    with pytest.raises(ApiKeyFileError, match="not an API key file"):
        keys.path.write_text(json.dumps({"keys": []}))
        method_for(keys.path)


async def test_the_chain_sends_keys_to_the_key_method_and_asks_for_one_when_nothing_is_presented(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    key, _ = keys.create("ci")
    chain = AuthenticatorChain([method_for(keys.path)])
    assert (await chain.authenticate(request(authorization=f"Bearer {key}"))).name == "ci"
    with pytest.raises(AuthFailure) as refused:
        await chain.authenticate(request())
    assert refused.value.status == 401 and "API key" in refused.value.message


def test_keys_created_at_once_by_many_processes_are_all_kept(tmp_path) -> None:
    path = tmp_path / "keys.json"
    processes = [subprocess.Popen([BASTION, "keys", "create", f"agent-{n}", "--file", str(path)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(6)]
    printed = {}
    for n, process in enumerate(processes):
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 0
        printed[f"agent-{n}"] = out.strip()
    stored, _ = ApiKeyFile(path).load()
    assert sorted(stored) == sorted(printed)
    assert all(stored[name].digest == digest(key) for name, key in printed.items())


async def test_many_requests_at_once_share_one_read_of_the_file(tmp_path) -> None:
    keys = ApiKeyFile(tmp_path / "keys.json")
    key, _ = keys.create("ci")
    method = ApiKeyMethod(keys)  # not loaded: the first requests read it, on a worker thread
    identities = await asyncio.gather(*(method.authenticate(request(x_api_key=key)) for _ in range(50)))
    assert {i.name for i in identities} == {"ci"}
