from __future__ import annotations

import pytest

from tests.conformance.runs import Runs
from tests.conformance.suite import missing_prerequisites


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    if reason := missing_prerequisites():
        pytest.fail(reason)
    return Runs(tmp_path_factory.mktemp("conformance"))
