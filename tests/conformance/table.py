"""Print the conformance tables of docs/testing.md from a real run of the suite (about two minutes):

    .venv/bin/python -m tests.conformance.table > /tmp/conformance.md
    .venv/bin/python -m tests.conformance.table everything   # the SDK's everything-server's tables alone

Server scenarios of both requirement sets against the fixture directly and through ``bastion serve`` (stdio,
Streamable HTTP and HTTP+SSE upstreams), then the client scenarios with Bastion's HTTP upstream as the client,
then why each known gap is one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.conformance.runs import UPSTREAMS, Runs, client_scenarios
from tests.conformance.suite import REQUIREMENT_SETS, ScenarioResult, SuiteRun, missing_prerequisites
from tests.conformance.test_client_scenarios import KNOWN_CLIENT_GAPS
from tests.conformance.test_everything_server import KNOWN_GAPS as EVERYTHING_GAPS
from tests.conformance.test_through_bastion import KNOWN_GAPS

UPSTREAM_TITLES = {
    "stdio": "through Bastion, stdio upstream",
    "http": "through Bastion, Streamable HTTP upstream",
    "sse": "through Bastion, HTTP+SSE upstream",
}


def cell(result: ScenarioResult) -> str:
    if result.passed:
        return "pass" if result.clean else f"pass, {len(result.warnings)} SHOULD missed"
    if not result.ran:
        return "not run"
    if not result.succeeded and not result.failures:
        return "n/a"  # every check INFO or skipped: what the scenario tests did not apply to the answers
    return f"**fail** ({len(result.failures)}/{result.succeeded + len(result.failures)} checks)"


def scored_note(run: SuiteRun, scenario: str) -> str:
    return "yes" if scenario in run.requirements.scored else f"no ({run.requirements.not_scored[scenario]})"


def server_table(runs: Runs, revision: str, server: str = "fixture") -> list[str]:
    direct = runs.direct(revision, server)
    through = {upstream: runs.through_bastion(revision, upstream, server) for upstream in UPSTREAMS}
    title = "fixture" if server == "fixture" else "everything-server"
    lines = [
        f"Server scenarios, requirement set `{revision}`" + ("" if server == "fixture" else
                                                              ", the SDK's everything-server") + ":",
        "",
        f"| scenario | scored | {title} directly | " + " | ".join(UPSTREAM_TITLES[u] for u in UPSTREAMS) + " |",
        "|---|---|---|" + "---|" * len(UPSTREAMS),
    ]
    for scenario in direct.requirements.scenarios:
        row = [f"`{scenario}`", scored_note(direct, scenario), cell(direct.result(scenario))]
        row += [cell(through[upstream].result(scenario)) for upstream in UPSTREAMS]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def client_table(runs: Runs) -> list[str]:
    by_revision = {revision: runs.client(revision) for revision in REQUIREMENT_SETS}
    names: list[str] = []
    for revision in REQUIREMENT_SETS:
        names += [name for name in client_scenarios(revision) if name not in names]
    lines = [
        "Client scenarios, Bastion's HTTP upstream as the client (DPoP and workload identity federation not "
        "attempted):",
        "",
        "| scenario | " + " | ".join(f"`{revision}`" for revision in REQUIREMENT_SETS) + " |",
        "|---|" + "---|" * len(REQUIREMENT_SETS),
    ]
    for name in names:
        row = [f"`{name}`"]
        for revision, run in by_revision.items():
            if name not in client_scenarios(revision):
                row.append("—")
            else:
                scored = "" if name in run.requirements.scored else " (not scored)"
                row.append(cell(run.result(name)) + scored)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def gap_notes() -> list[str]:
    lines = ["What fails through Bastion, and why (the tests' `KNOWN_GAPS` and `KNOWN_CLIENT_GAPS`):", ""]
    seen: dict[tuple[str, str], list[str]] = {}
    for (revision, upstream, scenario), why in KNOWN_GAPS.items():
        seen.setdefault((scenario, why), []).append(f"{revision}, {upstream} upstream")
    for (revision, upstream, scenario), why in EVERYTHING_GAPS.items():
        seen.setdefault((scenario, why), []).append(f"{revision}, everything-server, {upstream} upstream")
    for (revision, scenario), why in KNOWN_CLIENT_GAPS.items():
        seen.setdefault((scenario, why), []).append(f"{revision}, as a client")
    for (scenario, why), where in seen.items():
        lines.append(f"- `{scenario}` ({'; '.join(where)}): {why}.")
    return lines


def main() -> int:
    if reason := missing_prerequisites():
        print(reason, file=sys.stderr)
        return 1
    only_everything = sys.argv[1:] == ["everything"]
    with tempfile.TemporaryDirectory(prefix="bastion-conformance-") as folder:
        os.environ.setdefault("XDG_STATE_HOME", str(Path(folder) / "state"))  # the audit trail stays in here
        runs = Runs(Path(folder))
        everything = [("direct", r, "everything") for r in REQUIREMENT_SETS] + \
            [("bastion", r, u, "everything") for r in REQUIREMENT_SETS for u in UPSTREAMS]
        if only_everything:
            runs.prefetch(everything)
        else:
            runs.prefetch([("direct", r) for r in REQUIREMENT_SETS] + [("client", r) for r in REQUIREMENT_SETS]
                          + [("bastion", r, u) for r in REQUIREMENT_SETS for u in UPSTREAMS] + everything)
        try:
            sections = [] if only_everything else [server_table(runs, revision) for revision in REQUIREMENT_SETS]
            sections += [server_table(runs, revision, "everything") for revision in REQUIREMENT_SETS]
            if not only_everything:
                sections += [client_table(runs), gap_notes()]
        finally:
            runs.close()
        print("\n\n".join("\n".join(section) for section in sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
