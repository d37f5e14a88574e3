"""One cluster for the folder (tests/replicas/cluster.py): three replicas behind HAProxy on Redis, r3's Redis behind a
forwarder the fault tests stop. Its files run on one worker (tests/conftest.py, SHARED_BY_FILES), so it starts once:
the fault tests first, then the load on the replicas they left (one killed and started again, Redis restarted)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.replicas.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from load import LOAD_HTTP  # noqa: E402


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("replicas"), cut="r3", http=LOAD_HTTP) as running:
        yield running
