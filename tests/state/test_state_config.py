"""``[state]`` in a configuration file: validated at load with errors naming the file, the key and the fix, the
password's ``${env:NAME}``/``${file:PATH}`` expanded as other secrets are, and ``build_state`` making the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.compose import build_state
from bastion.config import ConfigError, load_config
from bastion.state import MemoryStore
from bastion.state.redis_store import RedisStore


def _load(tmp_path: Path, state: str):
    file = tmp_path / "bastion.toml"
    file.write_text(f"[state]\n{state}\n")
    return load_config(file, log_notes=False)


def _refused(tmp_path: Path, state: str) -> str:
    with pytest.raises(ConfigError) as failed:
        _load(tmp_path, state)
    message = str(failed.value)
    assert str(tmp_path / "bastion.toml") in message
    return message


def test_absent_is_this_process_memory(tmp_path: Path) -> None:
    file = tmp_path / "bastion.toml"
    file.write_text("[servers]\n")
    config = load_config(file, log_notes=False)
    assert config.state is None and isinstance(build_state(config), MemoryStore)


async def test_a_url_makes_a_redis_store_with_its_settings(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TEST_REDIS_PASSWORD", "from-env")
    config = _load(tmp_path, 'url = "redis://127.0.0.1:6390/2"\npassword = "${env:TEST_REDIS_PASSWORD}"\n'
                             'key_prefix = "team-a:"\ntimeout_seconds = 0.5\nmax_connections = 8')
    assert config.state.password == "from-env" and config.state.where == "redis 127.0.0.1:6390/2"
    store = build_state(config)
    try:
        assert isinstance(store, RedisStore) and store.shared and store.where == "redis 127.0.0.1:6390/2"
    finally:
        await store.aclose()


def test_the_password_comes_from_a_file_and_tls_files_from_beside_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "redis.pass").write_text("from-file\n")
    config = _load(tmp_path, 'url = "rediss://redis.internal:6380/0"\npassword = "${file:redis.pass}"\n'
                             'tls_ca_file = "ca.pem"\ntls_cert_file = "c.pem"\ntls_key_file = "c.key"')
    assert config.state.password == "from-file"
    assert config.state.tls_ca_file == str(tmp_path.resolve() / "ca.pem")


def test_a_password_in_the_url_is_refused_without_echoing_it(tmp_path: Path) -> None:
    message = _refused(tmp_path, 'url = "redis://:hunter2@127.0.0.1:6379/0"')
    assert "state.url" in message and "password" in message and "hunter2" not in message
    assert "${env:REDIS_PASSWORD}" in message


def test_an_unset_password_variable_names_the_key(tmp_path: Path) -> None:
    message = _refused(tmp_path, 'url = "redis://127.0.0.1:6379/0"\npassword = "${env:BASTION_TEST_UNSET_VARIABLE}"')
    assert "state.password" in message and "BASTION_TEST_UNSET_VARIABLE" in message


@pytest.mark.parametrize("state, said", [
    ('url = "http://127.0.0.1:6379/0"', "redis://HOST:PORT/DB"),
    ('url = "redis://127.0.0.1:6379/zero"', "database number"),
    ('url = "redis://127.0.0.1:6379/0?ssl_cert_reqs=none"', "no ?options"),
    ('url = "redis://127.0.0.1:6379/0"\ntls_ca_file = "ca.pem"', "rediss://"),
    ('url = "rediss://127.0.0.1:6379/0"\ntls_cert_file = "c.pem"', "go together"),
    ('url = "redis://127.0.0.1:6379/0"\ntimeout_seconds = 0', "timeout_seconds"),
    ('url = "redis://127.0.0.1:6379/0"\nkey_prefix = ""', "key_prefix"),
    ('url = "redis://127.0.0.1:6379/0"\nhost = "x"', "host"),
    ("password = \"x\"", "state.url"),
])
def test_bad_settings_are_refused_naming_the_key(tmp_path: Path, state: str, said: str) -> None:
    assert said in _refused(tmp_path, state)


def test_bastion_check_warns_of_a_plain_password_and_redis_without_tls_and_missing_tls_files(tmp_path: Path) -> None:
    from bastion.diagnostics import state_findings

    plain = state_findings(_load(tmp_path, 'url = "redis://redis.internal:6379/0"\npassword = "hunter2"'))
    assert {(f.level, f.where) for f in plain} == {("warning", "state.password"), ("warning", "state.url")}
    assert all("hunter2" not in f.message + f.fix for f in plain)
    good = state_findings(_load(tmp_path, 'url = "redis://127.0.0.1:6379/0"\npassword = "${env:HOME}"'))
    assert good == []
    missing = state_findings(_load(tmp_path, 'url = "rediss://redis.internal:6380/0"\ntls_ca_file = "ca.pem"'))
    assert [(f.level, f.where) for f in missing] == [("error", "state.tls_ca_file")]
