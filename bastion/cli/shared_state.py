"""The shared state store of a configuration, for a command that reads or changes what replicas keep there.

A command given ``--config`` whose ``[state]`` names a store the replicas share (Redis) acts on that store, where
every replica's pins, approval queue and tokens are; otherwise on the files of the state directory, as a gateway
without ``[state]`` keeps them. The store runs on a ``Blocking`` runner (the commands are not asynchronous) and is
closed when the command ends.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from bastion.state import StateStore
from bastion.state.blocking import Blocking


@contextmanager
def shared_state(config: Any) -> Iterator[tuple[StateStore, Blocking] | None]:
    """(the store, its runner) when ``config`` (a GatewayConfig, or None) names a shared store; else None."""
    if config is None:
        yield None
        return
    from bastion.compose import build_state

    async def opened() -> StateStore:
        return build_state(config)  # made on the runner's loop: a store's connections belong to the loop using them

    blocking = Blocking()
    try:
        store = blocking.run(opened())
        try:
            yield (store, blocking) if store.shared else None
        finally:
            blocking.run(store.aclose())
    finally:
        blocking.close()
