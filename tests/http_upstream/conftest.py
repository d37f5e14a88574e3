"""Remote servers on 127.0.0.1 for the HTTP upstream tests: real processes serving real HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

REMOTE_SERVER = Path(__file__).with_name("remote_server.py")


class RemoteServer:
    """One remote server process; ``url`` is where it serves. ``restart()`` brings it back on the same port."""

    def __init__(self, *args: str, events: Path | None = None) -> None:
        self.args = list(args)
        self.env = {**os.environ, "REMOTE_EVENTS": str(events)} if events is not None else None
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.start()

    def start(self, port: int = 0) -> None:
        self.proc = subprocess.Popen([sys.executable, str(REMOTE_SERVER), *self.args, "--port", str(port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith(("http://127.0.0.1:", "https://127.0.0.1:")), \
            f"the remote server did not start: {self.url!r}"

    @property
    def port(self) -> int:
        return int(self.url.split(":")[2].split("/")[0])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        port = self.port
        self.kill()
        self.start(port)


@pytest.fixture
def remote_server() -> Iterator[type[RemoteServer]]:
    started: list[RemoteServer] = []

    class Tracked(RemoteServer):
        def __init__(self, *args: str, events: Path | None = None) -> None:
            super().__init__(*args, events=events)
            started.append(self)

    yield Tracked
    for server in started:
        server.kill()
