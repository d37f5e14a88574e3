"""The suite's runs the conformance tests share: each target (the fixture directly, or Bastion in front of it) is
started and run once per requirement set, however many tests read the result."""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from pathlib import Path

from tests.conformance.suite import FIXTURE_SERVER, SuiteRun, bastion_over_http, fixture_over_http, run_server_scenarios

UPSTREAMS = ("stdio", "http")  # how Bastion reaches the fixture
# The suite calls the fixture's tools and prompts by their own names, so Bastion federates it without a prefix.
FIXTURE_NAME = "fx"
# Policy on, as users run it, and allowing everything: every request takes the whole policy path (Cedar, the
# input-schema check, the audit trail) without waiting for a person the suite cannot be.
ALLOW_ALL = """// Everything the conformance suite asks is allowed, so each request runs the whole policy path unattended.
permit (principal, action, resource);
"""


class Runs:
    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._done: dict[tuple[str, str], SuiteRun] = {}

    def _place(self, target: str, revision: str) -> Path:
        place = self._workdir / f"{target}-{revision}"
        place.mkdir(parents=True, exist_ok=True)
        return place

    def direct(self, revision: str) -> SuiteRun:
        """The server scenarios of ``revision`` against the fixture served over Streamable HTTP."""
        key = ("direct", revision)
        if key not in self._done:
            place = self._place(*key)
            with fixture_over_http(place) as url:
                self._done[key] = run_server_scenarios(url, revision, place / "results")
        return self._done[key]

    def through_bastion(self, revision: str, upstream: str) -> SuiteRun:
        """The server scenarios of ``revision`` against ``bastion serve`` federating the fixture, which Bastion
        starts itself over stdio (in its default sandbox) or reaches over Streamable HTTP."""
        key = (f"bastion-{upstream}", revision)
        if key not in self._done:
            place = self._place(*key)
            with ExitStack() as running:
                if upstream == "http":
                    entry = {"url": running.enter_context(fixture_over_http(place))}
                else:
                    entry = {"command": sys.executable, "args": [str(FIXTURE_SERVER)],
                             "sandbox": {"writable": [str(place)]}}
                config = write_bastion_config(place, entry)
                url = running.enter_context(bastion_over_http(config, place))
                self._done[key] = run_server_scenarios(url, revision, place / "results")
        return self._done[key]


def write_bastion_config(place: Path, fixture_entry: dict) -> Path:
    (place / "allow-all.cedar").write_text(ALLOW_ALL)
    server = {**fixture_entry, "prefix": "", "trust": "trusted", "request_timeout": 900}
    config = {
        "policy": {"policy_files": ["allow-all.cedar"]},
        # far beyond any server here: the suite's first tools/list sees the whole catalog
        "ready_timeout": 120,
        "servers": {FIXTURE_NAME: server},
    }
    path = place / "bastion.json"
    path.write_text(json.dumps(config, indent=2))
    return path
