"""The console of a configuration whose ``[state]`` names a Redis the replicas share: its approval queue and pins
are those in Redis (what every replica waits on and judges against), read and settled through a store of the
console's own, on a real Redis (tests/redis_server.py)."""

from __future__ import annotations

import pytest

from bastion.config import GatewayConfig
from bastion.console.approvals import settle, waiting_calls
from bastion.console.data import ConsoleData
from bastion.guardrails.pin_state import StatePins
from bastion.model import Identity
from bastion.policy.approval_state import StateQueue
from bastion.state.blocking import Blocking
from bastion.state.redis_store import RedisStore
from tests.redis_server import RedisServer

OPERATOR = Identity("olga", ("admins",), "header")


@pytest.fixture
def redis():
    server = RedisServer().start()
    yield server
    server.close()


def test_the_console_lists_and_settles_a_replica_s_waiting_call_in_redis(redis: RedisServer) -> None:
    data = ConsoleData(GatewayConfig.model_validate({"state": {"url": redis.url}}))
    queue = data.approval_queue()
    assert isinstance(queue, StateQueue) and isinstance(data.pins(), StatePins)

    replica = Blocking()  # a replica of its own, with its own connection to the same Redis
    store = RedisStore(redis.url)
    try:
        waiting = StateQueue(store)
        approval_id = replica.run(waiting.submit_async(
            {"identity": "alice", "who": {"name": "alice", "authenticated_by": "header"}, "server": "files",
             "tool": "write", "arguments": {"path": "/tmp/a"}}, 60))
        assert [call.id for call in waiting_calls(queue)] == [approval_id]
        done = settle(queue, approval_id, True, OPERATOR)
        assert done.status == "approved" and done.problem is None
        assert replica.run(waiting.read_async(approval_id)).record["by"] == "olga (header) in the console"
        assert settle(queue, approval_id, False, OPERATOR).problem.endswith("is already approved by olga (header) "
                                                                            "in the console")
        redis.stop()  # gone: nothing is settled, and the page says why
        assert "cannot be changed" in settle(queue, "0123456789ab", True, OPERATOR).problem
    finally:
        replica.run(store.aclose())
        replica.close()
        data.close()
