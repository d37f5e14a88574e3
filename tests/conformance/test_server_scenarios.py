"""The conformance suite's server scenarios, for both requirement sets, against the SDK-written fixture server served
directly over Streamable HTTP: the fixture passes every scenario the set scores, so that what fails through Bastion
is Bastion's doing.

Each run of a set takes 10-30 s on a loaded machine; the runs are shared by the tests of this package.
"""

from __future__ import annotations

import pytest

from tests.conformance.runs import Runs
from tests.conformance.suite import REQUIREMENT_SETS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("revision", REQUIREMENT_SETS)
def test_the_fixture_passes_every_scored_server_scenario_directly(runs: Runs, revision: str) -> None:
    run = runs.direct(revision)
    assert run.requirements.scored, f"requirement set {revision} lists no server scenario"
    failing = [scenario for scenario in run.requirements.scored if not run.result(scenario).passed]
    assert not failing, "\n".join(run.describe(scenario) for scenario in failing) + "\n\n" + run.output[-3000:]


@pytest.mark.parametrize("revision", REQUIREMENT_SETS)
def test_the_suite_ran_every_scenario_of_the_set(runs: Runs, revision: str) -> None:
    run = runs.direct(revision)
    unrun = [scenario for scenario in run.requirements.scenarios if scenario not in run.results]
    assert not unrun, f"no results for {unrun}:\n{run.output[-3000:]}"
