"""Approvals kept in a real Redis (``shared_state`` a ``RedisStore``) when that Redis goes away: a call that needs
the store to be decided is refused, never run unapproved nor twice; a person's yes given meanwhile runs its one
call. The gateways and the raw server are those of tests/policy/test_approval_once.py."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from bastion.model import GatewayError
from bastion.state.redis_store import RedisStore
from tests.policy.test_approval_once import (  # noqa: F401 - gateway_factory is a fixture
    BIG, approved, executions, gateway_factory, modern, outcome, policy_config)
from tests.policy.test_pipeline import ACCEPT, Person, call, session
from tests.redis_server import RedisServer, redis_available

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed (scripts/setup.sh)")


@pytest.fixture
async def redis_store():
    server = RedisServer().start()
    store = RedisStore(f"redis://127.0.0.1:{server.port}/0", key_prefix=f"a{secrets.token_hex(4)}:", timeout=0.5)
    try:
        yield server, store
    finally:
        await store.aclose()
        server.close()


def _refused_for_the_store(error) -> None:
    assert isinstance(error, GatewayError), error
    assert error.code == -32000 and error.data["rule"] == "approval:state-unavailable"
    assert "was not run" in error.message and "cannot be reached" in error.message


async def test_a_reuse_window_on_redis_refuses_while_redis_is_away(tmp_path: Path, gateway_factory,
                                                                   redis_store) -> None:
    server, store = redis_store
    gateway, _ = await gateway_factory(policy_config(tmp_path, reuse_seconds=30), shared_state=store)
    first = await call(gateway, modern(), BIG, {"size": 2})
    assert (await call(gateway, modern(), BIG, {"size": 2}, **approved(first["requestState"])))["content"]
    assert (await call(gateway, modern(), BIG, {"size": 2}))["content"]  # reused, from Redis
    second = await call(gateway, modern(), BIG, {"size": 9})
    server.stop()
    _refused_for_the_store(await outcome(call(gateway, modern(), BIG, {"size": 2})))
    # A state brought back while Redis is away cannot be used up: refused, not run; it stays good for later.
    _refused_for_the_store(await outcome(call(gateway, modern(), BIG, {"size": 9}, **approved(second["requestState"]))))
    server.start()
    assert (await call(gateway, modern(), BIG, {"size": 9}, **approved(second["requestState"])))["content"]
    assert await executions(gateway, tmp_path) == 3


async def test_a_persons_yes_while_redis_is_away_runs_its_call_once(tmp_path: Path, gateway_factory,
                                                                    redis_store) -> None:
    server, store = redis_store
    gateway, _ = await gateway_factory(policy_config(tmp_path, reuse_seconds=30), shared_state=store)
    person = Person(ACCEPT)
    asked = await call(gateway, modern(), BIG, {"size": 1})
    server.stop()
    # The reuse window cannot be looked up: refused rather than put to the person again.
    _refused_for_the_store(await outcome(call(gateway, session(client=person), BIG, {"size": 1})))
    _refused_for_the_store(await outcome(call(gateway, modern(), BIG, {"size": 1}, **approved(asked["requestState"]))))
    assert person.asked == []
    server.start()
    assert await executions(gateway, tmp_path) == 0
    assert (await call(gateway, modern(), BIG, {"size": 1}, **approved(asked["requestState"])))["content"]
    assert await executions(gateway, tmp_path) == 1


class PersonWhileRedisStops(Person):
    """Says yes, and Redis stops while the person answers: the grant for identical calls cannot be kept."""

    def __init__(self, server: RedisServer) -> None:
        super().__init__(ACCEPT)
        self.server = server

    async def request(self, method, params):
        self.server.stop()
        return await super().request(method, params)


async def test_a_yes_whose_reuse_grant_cannot_be_kept_still_runs_its_call_once(tmp_path: Path, gateway_factory,
                                                                               redis_store, caplog) -> None:
    server, store = redis_store
    gateway, _ = await gateway_factory(policy_config(tmp_path, reuse_seconds=30), shared_state=store)
    person = PersonWhileRedisStops(server)
    assert (await call(gateway, session(client=person), BIG, {"size": 4}))["content"][0]["text"] == "xxxx"
    assert len(person.asked) == 1
    assert "not kept for policy.approval.reuse_seconds" in caplog.text
    server.start()
    assert await executions(gateway, tmp_path) == 1
