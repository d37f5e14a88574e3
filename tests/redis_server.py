"""A real Redis server for a test: Debian's ``redis-server`` on a free loopback port, in a folder of its own, started
and stopped by the test (``scripts/setup.sh`` installs the package). ``stop`` and ``start`` again on the same port
and folder are a Redis restart, with what it saved kept (``save_on_stop``) or lost."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    def __init__(self, *, password: str | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.password = password
        self.folder = Path(tempfile.mkdtemp(prefix="bastion-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> "RedisServer":
        arguments = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                     "--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no",
                     "--loglevel", "notice", *extra]
        if self.password:
            arguments += ["--requirepass", self.password]
        self.process = subprocess.Popen(arguments, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._wait_until_ready(self.process)
        return self

    @staticmethod
    def _wait_until_ready(process: subprocess.Popen[bytes]) -> None:
        """Redis logs "Ready to accept connections" once it listens: read its log to that line (or to its end, when
        it exits first), then keep draining it on a thread so that its pipe never fills."""
        assert process.stdout is not None
        said: list[bytes] = []
        for line in process.stdout:
            said.append(line)
            if b"Ready to accept connections" in line:
                threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
                return
        raise RuntimeError("redis-server exited: " + b"".join(said[-10:]).decode(errors="replace"))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _drain(stream) -> None:
    for _ in stream:
        pass


def redis_available() -> bool:
    return os.access(REDIS_SERVER, os.X_OK)
