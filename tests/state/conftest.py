"""The store under test: every contract test runs against each implementation of ``StateStore``."""

from __future__ import annotations

import pytest

from bastion.state import MemoryStore

IMPLEMENTATIONS = ["memory"]


@pytest.fixture(params=IMPLEMENTATIONS)
async def store(request):
    if request.param == "memory":
        built = MemoryStore()
    else:  # pragma: no cover - each implementation adds its branch
        raise AssertionError(request.param)
    try:
        yield built
    finally:
        await built.aclose()
