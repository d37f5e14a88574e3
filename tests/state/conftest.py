"""The store under test: every contract test runs against each implementation of ``StateStore``. Redis's is a real
``redis-server`` (tests/redis_server.py), one per test module, each test in a key prefix of its own."""

from __future__ import annotations

import secrets

import pytest

from bastion.state import MemoryStore
from bastion.state.redis_store import RedisStore
from tests.redis_server import RedisServer, redis_available

IMPLEMENTATIONS = ["memory", pytest.param("redis", marks=pytest.mark.skipif(
    not redis_available(), reason="redis-server is not installed (scripts/setup.sh installs it)"))]


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=IMPLEMENTATIONS)
async def store(request):
    if request.param == "memory":
        built = MemoryStore()
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        built = RedisStore(server.url, key_prefix=f"test-{secrets.token_hex(6)}:")
    else:  # pragma: no cover - each implementation adds its branch
        raise AssertionError(request.param)
    try:
        yield built
    finally:
        await built.aclose()
