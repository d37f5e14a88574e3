"""The encrypted token store: what is on disk, who may read it, and how two processes share it."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bastion.transport.credentials import CredentialsError
from bastion.credentials.store import KEY_NAME, STORE_NAME, TokenSet, TokenStore, load_or_create_key, parse_key

SECRET = "at-4f1c9e7d0b2a-very-secret"
REFRESH = "rt-77aa0c-also-secret"


def _store(directory: Path, environ: dict[str, str] | None = None) -> TokenStore:
    return TokenStore.default(directory, environ={} if environ is None else environ)


def test_tokens_round_trip_and_nothing_readable_is_on_disk(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put("github", "alice", TokenSet(SECRET, REFRESH, 2_000_000_000.0, "repo read:org"))
    store.put("github", "bob", TokenSet("bob-token"))
    store.put("jira", "alice", TokenSet("jira-token", expires_at=1_900_000_000.0))

    again = _store(tmp_path)  # another instance, the same file and key file
    assert again.get("github", "alice") == TokenSet(SECRET, REFRESH, 2_000_000_000.0, "repo read:org")
    assert again.get("github", "carol") is None
    assert [(t.server, t.user, t.expires_at, t.scope) for t in again.list()] == [
        ("github", "alice", 2_000_000_000.0, "repo read:org"), ("github", "bob", None, None),
        ("jira", "alice", 1_900_000_000.0, None)]

    on_disk = (tmp_path / STORE_NAME).read_bytes()
    for plain in (SECRET, REFRESH, "alice", "github", "repo read:org"):
        assert plain.encode() not in on_disk
    assert (tmp_path / STORE_NAME).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / KEY_NAME).stat().st_mode & 0o777 == 0o600
    # no temporary file of a write is left beside the store
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{STORE_NAME}.")]


def test_delete_one_user_or_a_whole_server(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for user in ("alice", "bob"):
        store.put("github", user, TokenSet(f"{user}-gh"))
        store.put("jira", user, TokenSet(f"{user}-jira"))
    assert store.delete("github", "alice") == 1
    assert store.delete("github", "alice") == 0
    assert store.get("github", "bob") == TokenSet("bob-gh")
    assert store.delete("jira") == 2
    assert [(t.server, t.user) for t in store.list()] == [("github", "bob")]


def test_revoke_forgets_a_users_tokens_and_secrets(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put("github", "alice", TokenSet("a1"))
    store.put("jira", "alice", TokenSet("a2"))
    store.put("github", "bob", TokenSet("b1"))
    store.set_secret("gh-local", "alice", "GITHUB_TOKEN", "ghp_alice")
    store.set_secret("gh-local", "bob", "GITHUB_TOKEN", "ghp_bob")
    assert store.get_secrets("gh-local", "alice") == {"GITHUB_TOKEN": "ghp_alice"}

    assert store.revoke("alice", "jira") == 1
    assert store.get("github", "alice") == TokenSet("a1")
    assert store.revoke("alice") == 2
    assert store.get("github", "alice") is None and store.get_secrets("gh-local", "alice") == {}
    assert store.get("github", "bob") == TokenSet("b1")
    assert [(s.server, s.user, s.name) for s in store.list_secrets()] == [("gh-local", "bob", "GITHUB_TOKEN")]


def test_another_key_cannot_read_it_and_the_error_names_the_fix_not_the_tokens(tmp_path: Path) -> None:
    key = base64.b64encode(os.urandom(32)).decode()
    TokenStore.default(tmp_path, environ={"BASTION_CREDENTIALS_KEY": key}).put("s", "alice", TokenSet(SECRET))
    assert not (tmp_path / KEY_NAME).exists()  # the environment's key: no key file is made

    with pytest.raises(CredentialsError) as refused:
        _store(tmp_path).get("s", "alice")  # the key file's key, a different one
    assert "BASTION_CREDENTIALS_KEY" in str(refused.value)
    assert SECRET not in str(refused.value)
    assert TokenStore.default(tmp_path, environ={"BASTION_CREDENTIALS_KEY": key}).get("s", "alice").access_token == SECRET


def test_a_damaged_file_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put("s", "alice", TokenSet(SECRET))
    path = tmp_path / STORE_NAME
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    path.write_bytes(bytes(blob))
    with pytest.raises(CredentialsError, match="cannot be decrypted"):
        _store(tmp_path).get("s", "alice")


def test_keys_in_base64_url_safe_base64_or_hex_and_nothing_else(tmp_path: Path) -> None:
    raw = bytes(range(32))
    assert parse_key(base64.b64encode(raw).decode()) == raw
    assert parse_key(base64.urlsafe_b64encode(raw).decode().rstrip("=")) == raw
    assert parse_key(raw.hex()) == raw
    for bad in ("", "short", base64.b64encode(raw[:16]).decode()):
        with pytest.raises(CredentialsError, match="32-byte"):
            parse_key(bad)


def test_a_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    key = load_or_create_key(tmp_path / KEY_NAME, environ={})
    assert load_or_create_key(tmp_path / KEY_NAME, environ={}) == key  # made once, then read
    os.chmod(tmp_path / KEY_NAME, 0o644)
    with pytest.raises(CredentialsError, match="chmod 600"):
        load_or_create_key(tmp_path / KEY_NAME, environ={})


def test_a_change_made_by_another_process_is_seen_by_a_store_already_open(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put("github", "alice", TokenSet("a1"))
    assert store.get("github", "alice") is not None  # read once, so the document is cached
    _run(tmp_path, "store.revoke('alice')")
    assert store.get("github", "alice") is None


def test_writers_in_several_processes_lose_nothing(tmp_path: Path) -> None:
    _store(tmp_path).put("seed", "nobody", TokenSet("x"))  # the key file exists before the writers race
    writers = [_start(tmp_path, f"""
        for i in range(15):
            store.put("s{n}", f"user{{i}}", TokenSet(f"token-{n}-{{i}}"))
        """) for n in range(4)]
    for writer in writers:
        assert writer.wait(timeout=60) == 0, writer.stderr.read()
    store = _store(tmp_path)
    assert len(store.list()) == 1 + 4 * 15
    assert store.get("s3", "user14") == TokenSet("token-3-14")


def test_processes_opening_the_store_first_at_the_same_moment_agree_on_one_key(tmp_path: Path) -> None:
    openers = [_start(tmp_path, f"store.put('s', 'user{n}', TokenSet('t{n}'))") for n in range(4)]
    for opener in openers:
        assert opener.wait(timeout=60) == 0, opener.stderr.read()
    assert len(_store(tmp_path).list()) == 4  # every write readable with the one key file left
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_token_sets_from_a_token_endpoints_answer() -> None:
    tokens = TokenSet.from_response({"access_token": SECRET, "token_type": "bearer", "expires_in": 60,
                                     "scope": "a b"}, now=1000.0, refresh_token=REFRESH)
    assert tokens == TokenSet(SECRET, REFRESH, 1060.0, "a b", "bearer")
    assert tokens.authorization() == f"Bearer {SECRET}"
    assert tokens.expires_within(61, now=1000.0) and not tokens.expires_within(59, now=1000.0)
    assert not TokenSet("x").expires_within(10**9)
    assert SECRET not in repr(tokens) and REFRESH not in repr(tokens)
    assert TokenSet.from_response({"access_token": "n", "refresh_token": "new"}, refresh_token="old").refresh_token == "new"
    with pytest.raises(CredentialsError):
        TokenSet.from_response({"error": "invalid_client"})


async def test_the_async_methods_do_the_same_off_the_loop(tmp_path: Path) -> None:
    store = _store(tmp_path)
    await store.put_async("s", "alice", TokenSet("a"))
    assert await store.get_async("s", "alice") == TokenSet("a")
    assert await store.delete_async("s", "alice") == 1
    assert await store.get_async("s", "alice") is None


def _script(directory: Path, body: str) -> str:
    return textwrap.dedent(f"""
        from pathlib import Path
        from bastion.credentials.store import TokenSet, TokenStore
        store = TokenStore.default(Path({str(directory)!r}), environ={{}})
    """) + textwrap.dedent(body)


def _start(directory: Path, body: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _script(directory, body)], stderr=subprocess.PIPE, text=True)


def _run(directory: Path, body: str) -> None:
    process = _start(directory, body)
    assert process.wait(timeout=60) == 0, process.stderr.read()
