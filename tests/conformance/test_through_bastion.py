"""The conformance suite's server scenarios, for both requirement sets, against ``bastion serve --http`` federating
the SDK-written fixture server, which Bastion starts over stdio (sandboxed) or reaches over Streamable HTTP: every
scenario that passes against the fixture directly passes through Bastion.

The fixture is federated with ``prefix = ""`` (the suite calls tools and prompts by their own names), trusted, under
a Cedar policy that allows everything, so each request runs the whole policy path without asking a person.

``KNOWN_GAPS`` lists what passes directly and does not yet pass through Bastion, each with why; a test asserts each
still fails as described, so an entry is removed as soon as its gap closes.
"""

from __future__ import annotations

import pytest

from tests.conformance.runs import UPSTREAMS, Runs
from tests.conformance.suite import REQUIREMENT_SETS

pytestmark = pytest.mark.slow

# (revision, upstream, scenario) -> why it does not pass through Bastion yet
KNOWN_GAPS: dict[tuple[str, str, str], str] = {}

CASES = [(revision, upstream) for revision in REQUIREMENT_SETS for upstream in UPSTREAMS]


def _case_id(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize(("revision", "upstream"), CASES, ids=map(_case_id, CASES))
def test_every_scenario_passing_directly_passes_through_bastion(runs: Runs, revision: str, upstream: str) -> None:
    direct = runs.direct(revision)
    through = runs.through_bastion(revision, upstream)
    assert direct.passing(), f"nothing passed directly:\n{direct.output[-3000:]}"
    expected_to_fail = {scenario for (rev, up, scenario) in KNOWN_GAPS if (rev, up) == (revision, upstream)}
    # a scenario that passes directly without a warning (every SHOULD met) meets every SHOULD through Bastion too
    lost = sorted(((direct.passing() - through.passing()) | (direct.clean() - through.clean())) - expected_to_fail)
    assert not lost, (
        f"{len(lost)} scenario(s) pass against the fixture directly (or without a warning) but not through Bastion "
        f"({upstream} upstream):\n"
        + "\n".join(through.describe(scenario) for scenario in lost)
    )


@pytest.mark.parametrize(("revision", "upstream"), CASES, ids=map(_case_id, CASES))
def test_known_gaps_are_still_gaps(runs: Runs, revision: str, upstream: str) -> None:
    gaps = {scenario: why for (rev, up, scenario), why in KNOWN_GAPS.items() if (rev, up) == (revision, upstream)}
    if not gaps:
        pytest.skip(f"no known gap for {revision} through the {upstream} upstream")
    direct = runs.direct(revision)
    through = runs.through_bastion(revision, upstream)
    closed = [scenario for scenario in gaps if through.result(scenario).passed
              and (through.result(scenario).clean or not direct.result(scenario).clean)]
    assert not closed, f"now passing through Bastion, remove from KNOWN_GAPS: {closed}"
    not_gaps = [scenario for scenario in gaps if not direct.result(scenario).passed]
    assert not not_gaps, f"these fail directly too, so they are not Bastion's gaps: {not_gaps}"
