"""``/healthz`` and ``/readyz``: whether the gateway process answers, and whether it is ready for clients.

Unauthenticated (load balancers and Kubernetes probes present no credentials), so the answer names nothing: no
server, path or version, only counts and ok/failing per check.

Ready means every check holds:

- servers: every enabled server is ready. While servers are still starting the gateway is not ready (a client sent
  there now would get part of the catalog); once one is down (crashed and restarting, failed, given up) it is not
  ready again until that server is back, so a balancer sends clients to a replica that has it. A server that is
  meant to be absent is disabled in the configuration (``enabled = false``), not left failing.
- audit: the audit trail is being written (when the policy keeps one).
- state: the state store answers (``ping``) within ``STATE_TIMEOUT`` seconds: always, for this process's memory;
  for a shared store (``[state]``, Redis), while it is reachable, so a balancer stops sending clients to a replica
  whose calls would be refused for want of it, and sends them again, with no restart, once it answers.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from bastion.gateway.core import Gateway

STATE_TIMEOUT = 2.0
ALIVE = orjson.dumps({"status": "ok"})


async def readiness(gateway: "Gateway") -> tuple[bool, bytes]:
    """Whether the gateway is ready, and the body that says why (counts and ok per check, nothing named)."""
    checks: dict[str, dict[str, Any]] = {"servers": servers_check(gateway)}
    policy = gateway.policy
    if policy is not None:
        writer = policy.audit.writer
        if writer is not None:
            checks["audit"] = {"ok": writer.failure is None}
    checks["state"] = {"ok": await state_reachable(gateway.state)}
    ready = all(check["ok"] for check in checks.values())
    return ready, orjson.dumps({"status": "ready" if ready else "not ready", "checks": checks})


def servers_check(gateway: "Gateway") -> dict[str, Any]:
    upstreams = list(gateway.upstreams.values())
    ready = sum(1 for upstream in upstreams if upstream.ready.is_set())
    starting = sum(1 for upstream in upstreams if upstream.status == "starting")
    return {"ok": ready == len(upstreams), "ready": ready, "starting": starting, "configured": len(upstreams)}


async def state_reachable(state: Any) -> bool:
    try:
        await asyncio.wait_for(state.ping(), STATE_TIMEOUT)
    except Exception:  # noqa: BLE001 - whatever the store's failure, the answer is "not reachable"
        return False
    return True
