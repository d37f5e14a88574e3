"""The suite's runs the conformance tests share: each target (the fixture directly, or Bastion in front of it) is
started and run once per requirement set, however many tests read the result.

The runs are independent (each has its own servers on their own ports, its own folder) and spend most of their time
waiting on each other's processes, so they run side by side, at most ``CONCURRENT_RUNS`` at a time: ``prefetch``
starts every run the selected tests will read, and a test waits only for the runs it reads.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from tests.conformance.bastion_client import EXTENSIONS
from tests.conformance.everything_server import EVERYTHING_DIR
from tests.conformance.suite import (
    SERVERS,
    SuiteRun,
    bastion_over_http,
    fixture_over_http,
    requirement_set,
    run_client_scenario,
    run_server_scenarios,
)

# How Bastion reaches the fixture: it starts it over stdio, or it reaches it at a URL over Streamable HTTP or over
# the old HTTP+SSE transport.
UPSTREAMS = ("stdio", "http", "sse")
CLIENT_DRIVER = Path(__file__).with_name("bastion_client.py")
# The authorization scenarios run with the mock server's auth table set to authorization_code (bastion_client.py);
# of those the suite marks as extensions, the ones Bastion implements run with theirs (client credentials with a
# secret or a signed assertion, enterprise-managed authorization); DPoP and workload identity federation are flows
# Bastion does not implement and are not attempted.
AUTH_PREFIX = "auth/"
NOT_ATTEMPTED_REASON = "extension"
ATTEMPTED_EXTENSIONS = frozenset(EXTENSIONS)
# What a server reads besides its script, which its sandbox must show it: the everything-server's package.
SERVER_FILES = {"everything": [str(EVERYTHING_DIR)]}
# The suite calls the fixture's tools and prompts by their own names, so Bastion federates it without a prefix.
FIXTURE_NAME = "fx"
# Policy on, as users run it, and allowing everything: every request takes the whole policy path (Cedar, the
# input-schema check, the audit trail) without waiting for a person the suite cannot be.
ALLOW_ALL = """// Everything the conformance suite asks is allowed: each request runs the whole policy path unattended.
permit (principal, action, resource);
"""


# Runs of the suite at once: each is a Node process driving one or two Python servers, mostly waiting on them; more
# than this on two cores only stretches each run's own timeouts.
CONCURRENT_RUNS = 4


class Runs:
    def __init__(self, workdir: Path, concurrent: int = CONCURRENT_RUNS) -> None:
        self._workdir = workdir
        self._pool = ThreadPoolExecutor(max_workers=concurrent, thread_name_prefix="conformance")
        self._started: dict[tuple[str, ...], Future] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _place(self, target: str, revision: str) -> Path:
        place = self._workdir / f"{target}-{revision}"
        place.mkdir(parents=True, exist_ok=True)
        return place

    def _start(self, key: tuple[str, ...], run: Callable[[], SuiteRun]) -> Future:
        with self._lock:
            if key not in self._started:
                self._started[key] = self._pool.submit(run)
            return self._started[key]

    def prefetch(self, needs: Iterable[tuple[str, ...]]) -> None:
        """Start every run named in ``needs``: ("direct", revision[, server]), ("client", revision) or
        ("bastion", revision, upstream[, server]), ``server`` one of ``SERVERS`` (the fixture when left out)."""
        for need in needs:
            if need[0] == "direct":
                self._start_direct(*need[1:])
            elif need[0] == "client":
                self._start_client(need[1])
            else:
                self._start_through_bastion(*need[1:])

    def direct(self, revision: str, server: str = "fixture") -> SuiteRun:
        """The server scenarios of ``revision`` against the fixture (or ``server``) served over Streamable HTTP."""
        return self._start_direct(revision, server).result()

    def client(self, revision: str) -> SuiteRun:
        """Every client scenario of ``revision`` but the authorization extensions, each run alone, with Bastion's
        HTTP upstream as the client (``bastion_client.py`` starts Bastion on the mock server's URL and drives it)."""
        runs = [future.result() for future in self._start_client(revision)]
        assert runs, f"requirement set {revision} lists no client scenario"
        merged = SuiteRun(runs[0].requirements, {}, "")
        for run in runs:
            merged.results.update(run.results)
            merged.output += run.output
        return merged

    def through_bastion(self, revision: str, upstream: str, server: str = "fixture") -> SuiteRun:
        """The server scenarios of ``revision`` against ``bastion serve`` federating the fixture (or ``server``),
        which Bastion starts itself over stdio (in its default sandbox) or reaches over Streamable HTTP or HTTP+SSE.
        The fixture runs under a policy that allows everything; the everything-server with the policy off."""
        return self._start_through_bastion(revision, upstream, server).result()

    def _start_direct(self, revision: str, server: str = "fixture") -> Future:
        def run() -> SuiteRun:
            place = self._place(_target("direct", server), revision)
            with fixture_over_http(place, server=server) as url:
                return run_server_scenarios(url, revision, place / "results")

        return self._start(("direct", revision, server), run)

    def _start_client(self, revision: str) -> list[Future]:
        command = f"{sys.executable} {CLIENT_DRIVER}"
        place = self._place("client", revision)

        def scenario_run(scenario: str) -> Callable[[], SuiteRun]:
            return lambda: run_client_scenario(command, scenario, revision, place / scenario)

        return [self._start(("client", revision, scenario), scenario_run(scenario))
                for scenario in client_scenarios(revision)]

    def _start_through_bastion(self, revision: str, upstream: str, server: str = "fixture") -> Future:
        def run() -> SuiteRun:
            place = self._place(_target(f"bastion-{upstream}", server), revision)
            with ExitStack() as running:
                if upstream == "http":
                    entry = {"url": running.enter_context(fixture_over_http(place, server=server))}
                elif upstream == "sse":
                    entry = {"url": running.enter_context(fixture_over_http(place, transport="sse", server=server)),
                             "transport": "sse"}
                else:
                    entry = {"command": sys.executable, "args": [str(SERVERS[server])],
                             "sandbox": {"writable": [str(place)], "read_only": SERVER_FILES.get(server, [])}}
                config = write_bastion_config(place, entry, policy=server == "fixture")
                url = running.enter_context(bastion_over_http(config, place))
                return run_server_scenarios(url, revision, place / "results")

        return self._start(("bastion", revision, upstream, server), run)


def _target(target: str, server: str) -> str:
    return target if server == "fixture" else f"{server}-{target}"


def client_scenarios(revision: str) -> list[str]:
    requirements = requirement_set(revision, "client")
    return [name for name in requirements.scenarios
            if not (name.startswith(AUTH_PREFIX) and requirements.not_scored.get(name) == NOT_ATTEMPTED_REASON
                    and name not in ATTEMPTED_EXTENSIONS)]


def write_bastion_config(place: Path, fixture_entry: dict, *, policy: bool = True) -> Path:
    """Bastion's configuration federating one server under ``FIXTURE_NAME``; ``policy``: under the allow-all Cedar
    policy, else with the policy off."""
    server = {**fixture_entry, "prefix": "", "trust": "trusted", "request_timeout": 900}
    config: dict = {
        "tools": {"exposure": "all"},  # the suite checks the fixture's own tool list
        # far beyond any server here: the suite's first tools/list sees the whole catalog
        "ready_timeout": 120,
        "servers": {FIXTURE_NAME: server},
        # The suite's scenarios send one caller dozens of elicitations a minute (every 2026-07-28 request of one
        # caller counts in one budget, docs/guardrails.md): the budget that spares a person that would refuse them.
        "guardrails": {"consent": {"max_requests": 10_000}},
    }
    if policy:
        (place / "allow-all.cedar").write_text(ALLOW_ALL)
        config["policy"] = {"policy_files": ["allow-all.cedar"]}
    else:
        config["policy"] = "off"
    path = place / "bastion.json"
    path.write_text(json.dumps(config, indent=2))
    return path
