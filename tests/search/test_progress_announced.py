"""Slow search steps are announced on the log while they run (bastion.progress), then timed."""

from __future__ import annotations

import logging
import time

from .conftest import CATALOG
from .test_index import embedding_held


def _progress(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bastion.progress"]


def test_a_long_minilm_embedding_is_announced_while_it_runs_and_timed_at_its_end(encoder, caplog):
    caplog.set_level(logging.INFO, logger="bastion.progress")
    label = f"tool search: MiniLM embedding {len(CATALOG)} tools"
    with embedding_held(encoder):
        deadline = time.monotonic() + 60
        while f"{label}…" not in _progress(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"{label}…" in _progress(caplog)
        assert not [m for m in _progress(caplog) if m.startswith(f"{label}: done")]
    assert [m for m in _progress(caplog) if m.startswith(f"{label}: done in ")]
