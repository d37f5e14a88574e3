"""Three (or one) real ``bastion serve --http`` replicas behind Debian's HAProxy on loopback, with a real
``redis-server`` for their shared state once the gateway can use one: what the replica tests and the load generator
(bench/load.py) run against.

One configuration for every replica: the default policy and guardrails, the counting server (counting_server.py)
federated as ``count``, API keys for a few identities, one ``policy.approval.secret_file`` and one
``http.session_key_files`` (with Redis: sessions continue on any replica); each replica has its own
state folder (its audit trail, its approval queue, its pins) and its own stderr. HAProxy balances round robin with
no stickiness, checks ``/readyz`` and redispatches a request whose connection failed. Everything is started here and
waited for by the event that says it is up (a replica's "serving MCP on" line and its ``/readyz`` answering 200,
HAProxy's stats socket saying every replica is UP), and ``close`` kills whatever is still running, so a test that
fails leaves no process behind.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.redis_server import RedisServer
from tests.support import BASTION, READY_TIMEOUT, free_port

HERE = Path(__file__).resolve().parent
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
START_TIMEOUT = 180.0  # far beyond a start on a busy 2-core machine (a few seconds): a hang fails, it does not stall
IDENTITIES = ("alice", "bob", "carol", "dave")


def gateway_supports_state() -> bool:
    """Whether this gateway reads a ``[state]`` table (the Redis store): until it does, the replicas run without one."""
    from bastion.config import GatewayConfig

    return "state" in GatewayConfig.model_fields


def base_config(folder: Path, marks: Path, *, redis_url: str | None, http: dict[str, Any] | None = None,
                replica: str, audit: Path | None = None) -> dict[str, Any]:
    """The configuration every replica runs (``replica`` only names it in the counting server's marks; ``audit``, when
    given, is where its audit trail goes instead of its state folder: a small disk the fault run fills)."""
    config: dict[str, Any] = {
        "ready_timeout": READY_TIMEOUT,
        "tools": {"exposure": "all"},
        "servers": {"count": {
            "command": sys.executable, "args": [str(HERE / "counting_server.py")], "trust": "trusted",
            "env": {"COUNTING_MARKS": str(marks), "COUNTING_REPLICA": replica},
            "request_timeout": 900, "sandbox": {"writable": [str(marks.parent)]}}},
        # The default policy's rules (no policy_files), with what replicas must share: the approval secret. The
        # client answers approvals itself (2026-07-28 input_required), so the load generator can drive them.
        "policy": {"approval": {"secret_file": str(folder / "approval.key"), "approver": "client",
                                "fallback": "refuse", "timeout_seconds": 300}},
        "auth": {"api_keys": str(folder / "api_keys.json")},
        "http": {"trusted_proxies": ["127.0.0.1/32"], "heartbeat_seconds": 5, **(http or {})},
    }
    if audit is not None:
        config["policy"]["audit"] = {"path": str(audit)}
    if redis_url is not None:
        config["state"] = {"url": redis_url}
        # One key ring for all: a handshake-era session continues on whichever replica round robin picks.
        config["http"]["session_key_files"] = [str(folder / "session.key")]
    return config


@dataclass
class Replica:
    name: str
    port: int
    config: Path
    state_home: Path
    stderr: Path
    process: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def audit(self) -> Path:
        return self.state_home / "bastion" / "audit.jsonl"

    def launch(self) -> None:
        self.state_home.mkdir(parents=True, exist_ok=True)
        with self.stderr.open("ab") as log:
            self.process = subprocess.Popen(
                [BASTION, "serve", str(self.config), "--http", f"127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(self.state_home)})

    def wait_ready(self, since: int = 0) -> None:
        """Until this start says where it serves (a line past ``since`` bytes of the log) and /readyz answers 200."""
        import httpx2

        deadline = time.monotonic() + START_TIMEOUT
        said = False
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"replica {self.name} exited with {self.process.returncode}: {self.log()[-3000:]}")
            if not said:
                said = "serving MCP on" in self.log()[since:]
            else:
                try:
                    if httpx2.get(self.base + "/readyz", timeout=5).status_code == 200:
                        return
                except httpx2.HTTPError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"replica {self.name} was not ready in {START_TIMEOUT:.0f} s: {self.log()[-3000:]}")

    def start(self) -> None:
        since = len(self.log())
        self.launch()
        self.wait_ready(since)

    def log(self) -> str:
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    def kill(self) -> None:
        """SIGKILL to the gateway and everything it started (its session: its servers, their sandboxes)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever outlived the gateway in its session
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def rss_kib(self) -> int:
        """The gateway process's resident set (its servers not counted), from /proc."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError(f"no VmRSS for replica {self.name}")


class Forwarder:
    """A tiny TCP forwarder (forwarder.py, a process of its own) between a replica and Redis: stopping it is that
    replica losing Redis while the others keep it; starting it again on the same port gives it back."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(HERE / "forwarder.py"), str(self.port),
                                         str(self.target_port)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if b"forwarding" not in line:
            raise AssertionError(f"the forwarder did not start: {line!r}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class HAProxy:
    def __init__(self, folder: Path, replicas: list[Replica]) -> None:
        self.port = free_port()
        self.folder = folder
        self.replicas = replicas
        self.socket = folder / "haproxy.sock"
        self.config = folder / "haproxy.cfg"
        self.process: subprocess.Popen | None = None
        self.output = folder / "haproxy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def write_config(self) -> None:
        servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check" for r in self.replicas)
        self.config.write_text(HAPROXY_CONFIG.format(socket=self.socket, port=self.port, servers=servers))

    def start(self) -> None:
        if not os.access(HAPROXY, os.X_OK):
            raise AssertionError(f"no HAProxy at {HAPROXY}: scripts/setup.sh installs Debian's "
                                 "(apt-get install haproxy)")
        self.write_config()
        with self.output.open("ab") as log:
            self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT)
        self.wait_states({r.name: "UP" for r in self.replicas})

    def command(self, line: str) -> str:
        """One command on HAProxy's stats socket (management.txt), and what it answered."""
        with socket.socket(socket.AF_UNIX) as stats:
            stats.settimeout(10)
            stats.connect(str(self.socket))
            stats.sendall(line.encode() + b"\n")
            data = b""
            while chunk := stats.recv(65536):
                data += chunk
        return data.decode()

    def states(self) -> dict[str, str]:
        """Each replica's state as HAProxy's health checks see it (UP, DOWN, ...), from its stats socket."""
        header, *rows = self.command("show stat").strip().splitlines()
        columns = header.lstrip("# ").split(",")
        found = {}
        for row in rows:
            values = dict(zip(columns, row.split(",")))
            if values.get("pxname") == "replicas" and values.get("svname") not in ("BACKEND", "FRONTEND"):
                found[values["svname"]] = values["status"].split(" ")[0]
        return found

    def wait_states(self, wanted: dict[str, str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"haproxy exited: {self.output.read_text(errors='replace')}")
            try:
                seen = self.states()
            except OSError:  # the socket is not there yet
                seen = {}
            if all(seen.get(name) == state for name, state in wanted.items()):
                return
            time.sleep(0.05)
        raise AssertionError(f"haproxy never saw {wanted}: it sees {seen}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# Why each line: docs/deploy.md, "Several replicas behind a load balancer".
HAPROXY_CONFIG = """\
global
    maxconn 8000
    stats socket {socket} mode 600 level admin
    log stdout format raw local0

defaults
    mode http
    log global
    option httplog
    option forwardfor
    option redispatch
    option abortonclose
    retries 3
    timeout connect 2s
    timeout http-request 30s
    timeout http-keep-alive 30s
    timeout queue 30s
    timeout client 1h
    timeout server 1h

frontend mcp
    bind 127.0.0.1:{port}
    maxconn 8000
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    default-server inter 500ms fastinter 200ms downinter 500ms fall 2 rise 1 maxconn 5000
{servers}
"""


@dataclass
class Cluster:
    """``Cluster(folder).start()``; ``close()`` always (it kills what is left). ``cut`` names a replica whose Redis
    goes through a Forwarder (``forwarder``) the test can stop."""

    folder: Path
    replicas_count: int = 3
    http: dict[str, Any] = field(default_factory=dict)
    cut: str | None = None
    audit_paths: dict[str, Path] = field(default_factory=dict)  # replica name -> its audit trail, when not the default
    with_redis: bool = field(default_factory=gateway_supports_state)
    replicas: list[Replica] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    redis: RedisServer | None = None
    forwarder: Forwarder | None = None
    haproxy: HAProxy | None = None

    @property
    def marks(self) -> Path:
        return self.folder / "marks" / "marks.log"

    @property
    def url(self) -> str:
        assert self.haproxy is not None
        return self.haproxy.url

    def start(self) -> "Cluster":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.marks.parent.mkdir(exist_ok=True)
        for key in ("approval.key", "session.key"):
            (self.folder / key).write_text(secrets.token_hex(32))
            os.chmod(self.folder / key, 0o600)
        self.keys = make_keys(self.folder / "api_keys.json", IDENTITIES)
        if self.with_redis:
            self.redis = RedisServer().start()
        names = [f"r{i + 1}" for i in range(self.replicas_count)]
        if self.cut is not None and self.redis is not None:
            self.forwarder = Forwarder(self.redis.port)
            self.forwarder.start()
        for name in names:
            config = self.folder / f"{name}.json"
            config.write_text(json.dumps(base_config(
                self.folder, self.marks, redis_url=self._redis_url(name), http=self.http, replica=name,
                audit=self.audit_paths.get(name))))
            self.replicas.append(Replica(name, free_port(), config, self.folder / name, self.folder / f"{name}.stderr"))
        for replica in self.replicas:  # all starting at once: the machine's cores share the wait
            replica.launch()
        for replica in self.replicas:
            replica.wait_ready()
        self.haproxy = HAProxy(self.folder, self.replicas)
        self.haproxy.start()

    def _redis_url(self, name: str) -> str | None:
        if self.redis is None:
            return None
        if name == self.cut and self.forwarder is not None:
            return f"redis://127.0.0.1:{self.forwarder.port}/0"
        return self.redis.url

    def replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def audit_trails(self) -> list[Path]:
        return [r.audit for r in self.replicas]

    def close(self) -> None:
        """Kill everything still running, whatever state the test left it in; never raises for what is gone."""
        if self.haproxy is not None:
            self.haproxy.stop()
        threads = [threading.Thread(target=r.stop) for r in self.replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.forwarder is not None:
            self.forwarder.stop()
        if self.redis is not None:
            self.redis.close()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_keys(file: Path, names: tuple[str, ...]) -> dict[str, str]:
    """A key per name in the file the replicas read (what ``bastion keys create`` does, without a process each)."""
    from bastion.auth.api_keys import ApiKeyFile

    keys = ApiKeyFile(file)
    return {name: keys.create(name)[0] for name in names}


def read_marks(path: Path) -> list[tuple[str, str, str]]:
    """The counting servers' marks: (event, replica, token) per line."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        event, replica, token = re.match(r"(\S+) (\S+) (.*)", line).groups()
        found.append((event, replica, token))
    return found


def session_problem(cluster: Cluster) -> str | None:
    """What stops a 2025-11-25 session from moving between replicas as round robin moves it, or None when nothing
    does: the handshake's three steps each sent to another replica, past the balancer (initialize to the first,
    notifications/initialized to the second, tools/list to the third, then to the first again)."""
    import httpx2

    if len(cluster.replicas) < 2:
        return None
    urls = [r.base + "/mcp" for r in cluster.replicas]
    urls = (urls * 2)[:4] if len(urls) == 2 else [*urls, urls[0]]
    headers = {"x-api-key": cluster.keys[IDENTITIES[0]], "content-type": "application/json",
               "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    opened = httpx2.post(urls[0], headers=headers, timeout=60, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}})
    assert opened.status_code == 200, opened.text
    session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"]}
    try:
        done = httpx2.post(urls[1], headers=session, timeout=60,
                           json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        if done.status_code == 404:
            return ("the replicas do not share 2025-11-25 sessions (no [state], or no http.session_key_files): a "
                    "session opened on one is unknown to the next a balancer without stickiness picks")
        for n, url in enumerate(urls[2:], start=2):
            listed = httpx2.post(url, headers=session, timeout=60,
                                 json={"jsonrpc": "2.0", "id": n, "method": "tools/list"})
            if listed.status_code != 200 or "error" in listed.text[:200]:
                replica = cluster.replicas[urls.index(url)].name
                return (f"a session opened on {cluster.replicas[0].name}, its handshake ended on "
                        f"{cluster.replicas[1].name}: tools/list on {replica} answered {listed.status_code} "
                        f"{listed.text[:160]}")
        return None
    finally:
        httpx2.delete(urls[0], headers=session, timeout=60)
