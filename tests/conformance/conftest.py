from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.runs import Runs
from tests.conformance.suite import missing_prerequisites


def _needs(item: pytest.Item) -> list[tuple[str, ...]]:
    """The suite's runs a selected test reads, from its module and parameters."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    revision = params.get("revision")
    if revision is None:
        return []
    module = item.module.__name__.rsplit(".", 1)[-1]
    if module == "test_server_scenarios":
        return [("direct", revision)]
    if module == "test_client_scenarios":
        return [("client", revision)]
    if module == "test_through_bastion":
        return [("direct", revision), ("bastion", revision, params["upstream"])]
    if module == "test_everything_server":
        needs = [("direct", revision, "everything")]
        if "upstream" in params:
            needs.append(("bastion", revision, params["upstream"], "everything"))
        return needs
    return []


@pytest.fixture(scope="session")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    if reason := missing_prerequisites():
        pytest.fail(reason)
    runs = Runs(tmp_path_factory.mktemp("conformance"))
    # Every run a selected test will read starts now, side by side; each test then waits for its own.
    runs.prefetch(need for item in request.session.items for need in _needs(item))
    yield runs
    runs.close()
