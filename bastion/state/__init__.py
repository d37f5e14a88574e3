"""Shared state: one interface (store.py), in this process's memory by default (memory.py), in Redis for replicas."""

from bastion.state.memory import MemoryStore
from bastion.state.store import TAKEN, Bucket, StateStore, StateUnavailable, Subscription, Taken

__all__ = ["Bucket", "MemoryStore", "StateStore", "StateUnavailable", "Subscription", "TAKEN", "Taken"]
