"""The suite's runs the conformance tests share: each target (the fixture directly, or Bastion in front of it) is
started and run once per requirement set, however many tests read the result."""

from __future__ import annotations

from pathlib import Path

from tests.conformance.suite import SuiteRun, fixture_over_http, run_server_scenarios


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
