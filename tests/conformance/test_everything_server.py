"""The conformance suite's server scenarios, for both requirement sets, against the official Python SDK's own
conformance server (``mcp_everything_server`` from the mcp source archive, see ``everything_server.py``): served
directly over Streamable HTTP, and behind ``bastion serve --http`` with the policy off and every tool exposed, which
starts it over stdio (sandboxed) or reaches it over Streamable HTTP or HTTP+SSE.

Every scenario that passes against it directly passes through Bastion, but for ``KNOWN_GAPS`` (each with why),
which are asserted to still fail, so an entry is removed as soon as its gap closes. Unlike the project's fixture,
this server is written by the SDK's authors for the suite, with its own choices: a mid-call sampling or elicitation
request on a handshake-era connection, tool and prompt list changes announced on ``subscriptions/listen`` streams.
"""

from __future__ import annotations

import pytest

from tests.conformance.everything_server import missing
from tests.conformance.runs import UPSTREAMS, Runs
from tests.conformance.suite import REQUIREMENT_SETS

pytestmark = pytest.mark.slow

SERVER = "everything"
# (revision, upstream, scenario) -> why it does not pass through Bastion yet
KNOWN_GAPS: dict[tuple[str, str, str], str] = {}
# Scenarios the SDK's server itself does not pass (the suite's tasks extension, which the SDK does not implement);
# never scored by either requirement set.
NOT_PASSING_DIRECTLY = frozenset({
    "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal",
    "tasks-mrtr-input", "tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-status-notifications",
    "tasks-required-task-error", "tasks-mrtr-composition",
})



@pytest.fixture(autouse=True)
def _everything_server_unpacked() -> None:
    if reason := missing():
        pytest.fail(reason)


CASES = [(revision, upstream) for revision in REQUIREMENT_SETS for upstream in UPSTREAMS]


def _case_id(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("revision", REQUIREMENT_SETS)
def test_the_everything_server_passes_its_scenarios_directly(runs: Runs, revision: str) -> None:
    run = runs.direct(revision, SERVER)
    unrun = [scenario for scenario in run.requirements.scenarios if scenario not in run.results]
    assert not unrun, f"no results for {unrun}:\n{run.output[-3000:]}"
    failing = [scenario for scenario in run.requirements.scenarios
               if not run.result(scenario).passed and scenario not in NOT_PASSING_DIRECTLY]
    assert not failing, "\n".join(run.describe(scenario) for scenario in failing) + "\n\n" + run.output[-3000:]


@pytest.mark.parametrize(("revision", "upstream"), CASES, ids=map(_case_id, CASES))
def test_every_scenario_passing_directly_passes_through_bastion(runs: Runs, revision: str, upstream: str) -> None:
    direct = runs.direct(revision, SERVER)
    through = runs.through_bastion(revision, upstream, SERVER)
    assert direct.passing(), f"nothing passed directly:\n{direct.output[-3000:]}"
    expected_to_fail = {scenario for (rev, up, scenario) in KNOWN_GAPS if (rev, up) == (revision, upstream)}
    # a scenario that passes directly without a warning (every SHOULD met) meets every SHOULD through Bastion too
    lost = sorted(((direct.passing() - through.passing()) | (direct.clean() - through.clean())) - expected_to_fail)
    assert not lost, (
        f"{len(lost)} scenario(s) pass against the everything-server directly (or without a warning) but not through "
        f"Bastion "
        f"({upstream} upstream):\n" + "\n".join(through.describe(scenario) for scenario in lost)
    )


@pytest.mark.parametrize(("revision", "upstream"), CASES, ids=map(_case_id, CASES))
def test_known_gaps_are_still_gaps(runs: Runs, revision: str, upstream: str) -> None:
    gaps = {scenario: why for (rev, up, scenario), why in KNOWN_GAPS.items() if (rev, up) == (revision, upstream)}
    if not gaps:
        pytest.skip(f"no known gap for {revision} through the {upstream} upstream")
    direct = runs.direct(revision, SERVER)
    through = runs.through_bastion(revision, upstream, SERVER)
    closed = [scenario for scenario in gaps if through.result(scenario).passed
              and (through.result(scenario).clean or not direct.result(scenario).clean)]
    assert not closed, f"now passing through Bastion, remove from KNOWN_GAPS: {closed}"
    not_gaps = [scenario for scenario in gaps if not direct.result(scenario).passed]
    assert not not_gaps, f"these fail directly too, so they are not Bastion's gaps: {not_gaps}"
