"""The image's runtime conditions, emulated with bubblewrap on this machine (no Docker engine runs here): a user
namespace as uid/gid 10001 with no capabilities and no_new_privs (securityContext: runAsUser 10001, capabilities
drop ALL, allowPrivilegeEscalation false), a root file system of /usr and /etc read-only with nothing else
writable but a data volume at /var/lib/bastion (XDG_STATE_HOME, XDG_CACHE_HOME, HOME) and /tmp (the emptyDirs),
and the image's entry point, in a pid namespace of its own with that namespace's /proc (util-linux's unshare makes
both, as the runtime does for the pod). Bastion's sandbox then nests its own bubblewrap inside, as it does in the pod.

What this shows: the entry point's self-check passes, and `bastion run` serves a sandboxed server to the SDK's
client in both eras, from a read-only root, writing only to the volumes. What it does not: the container runtime's
own seccomp and AppArmor profiles, a kubelet, or the image's Debian userland (the host's /usr stands in for it).
With /proc masked as runtimes mask it by default (bwrap's own --proc makes /proc/sys and others read-only mounts,
as runc's readonlyPaths do), the nested sandbox cannot mount its /proc: which is why the pod sets procMount:
Unmasked, and the second test shows the entry point refusing to start there."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.deploy.dockerfile import ENTRYPOINT, ROOT
from tests.support import READY_TIMEOUT

pytestmark = pytest.mark.slow

BWRAP = "/usr/bin/bwrap"
MALICIOUS = ROOT / "tests" / "sandbox" / "malicious_server.py"
PYTHON_HOME = Path(sys.base_prefix).resolve()
VENV = Path(sys.prefix)
SECRET = "BASTION_TEST_CONTAINER_SECRET"

if not os.path.exists(BWRAP):
    pytest.skip("bubblewrap is not installed (scripts/setup.sh installs it)", allow_module_level=True)


def container(data: Path, *, masked_proc: bool = False, extra: list[str] = ()) -> list[str]:
    """bwrap arguments that put a command in the image's conditions; ``data`` is the /var/lib/bastion volume."""
    if masked_proc:
        # bwrap's /proc of the container's pid namespace: /proc/sys, /proc/irq, /proc/bus... covered read-only.
        runtime, pid_namespace, proc = [], ["--unshare-pid"], ["--proc", "/proc"]
    else:
        # An unmasked /proc of the container's own pid namespace, nothing mounted over any part of it: util-linux's
        # unshare makes the namespace and mounts it, bwrap binds it. (The host's /proc in a namespace of bwrap's
        # would not do: bwrap, nested inside, looks its sandbox's pid up in /proc, and finds another process or
        # none, at random.)
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        runtime = ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child", "--"]
        pid_namespace, proc = [], ["--bind", "/proc", "/proc"]
    binds = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            binds += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            binds += ["--ro-bind", f"/{link}", f"/{link}"]
    # The application, as /opt/bastion is in the image; a folder before any inside it, which it would cover.
    for tree in sorted({ROOT, VENV, PYTHON_HOME}, key=lambda path: len(path.parts)):
        binds += ["--ro-bind", str(tree), str(tree)]
    return [
        *runtime, BWRAP, "--unshare-user", "--uid", "10001", "--gid", "10001", *pid_namespace, "--unshare-ipc",
        "--unshare-uts", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        *binds, *proc, "--dev", "/dev",
        "--tmpfs", "/tmp", "--bind", str(data), "/var/lib/bastion",
        "--bind", os.environ["XDG_CACHE_HOME"], "/var/lib/bastion/cache", *extra,
        "--remount-ro", "/", "--chdir", "/var/lib/bastion",
        "--setenv", "PATH", f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "--setenv", "HOME", "/var/lib/bastion",
        "--setenv", "XDG_STATE_HOME", "/var/lib/bastion/state",
        "--setenv", "XDG_CACHE_HOME", "/var/lib/bastion/cache",
        "--setenv", "XDG_CONFIG_HOME", "/etc",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--",
    ]


def stop(process: subprocess.Popen) -> None:
    """The container stopped as a runtime stops it: every process in its pid namespace killed, and gone on return.

    unshare ignores SIGTERM while it waits for the namespace's init (bwrap), which takes from outside only the
    signals it handles: so unshare is killed, its child gets SIGKILL (--kill-child), and the kernel kills and reaps
    the rest of the namespace before the init itself has exited, which its pidfd tells."""
    try:
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    except OSError:  # unshare is gone already
        children = []
    inits = []
    for pid in children:
        try:
            inits.append(os.pidfd_open(int(pid)))
        except ProcessLookupError:
            pass
    process.kill()
    process.wait(60)
    for init in inits:
        assert select.select([init], [], [], 60)[0], "the container's init outlived unshare"
        os.close(init)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """The /var/lib/bastion volume. Its cache is the test run's (tests/conftest.py): what only saves time (the
    derived search model, compiled rules) is made once per run, not once per test."""
    folder = tmp_path / "volume"
    (folder / "cache").mkdir(parents=True)  # where the run's cache is mounted
    return folder


def test_inside_the_image_conditions_the_self_check_passes(data: Path):
    probe = subprocess.run(
        container(data) + ["/bin/sh", "-c",
                           "id -u; id -g; grep -E '^(CapEff|NoNewPrivs):' /proc/self/status; "
                           "touch /x 2>&1; touch /usr/x 2>&1; touch /etc/x 2>&1; "
                           "touch /var/lib/bastion/ok /tmp/ok && echo writable"],
        capture_output=True, text=True, timeout=60)
    lines = probe.stdout.splitlines()
    assert lines[:2] == ["10001", "10001"], probe
    assert "CapEff:\t0000000000000000" in lines and "NoNewPrivs:\t1" in lines
    assert sum("Read-only file system" in line for line in lines) == 3
    assert lines[-1] == "writable"

    doctor = subprocess.run(container(data) + [str(ENTRYPOINT), "sandbox", "doctor"],
                            capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    report = doctor.stdout + doctor.stderr
    assert "[ok] user namespaces: a sandbox started as uid 65534" in report
    assert "sandbox usable" in report


def test_with_proc_masked_the_entrypoint_refuses_to_serve(data: Path, tmp_path: Path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "bastion.toml").write_text('policy = "off"\n')
    started = subprocess.run(
        container(data, masked_proc=True, extra=["--ro-bind", str(config), "/config"])
        + [str(ENTRYPOINT), "serve", "/config/bastion.toml", "--http", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120)
    assert started.returncode == 1
    assert "Can't mount proc" in started.stderr
    assert "servers cannot be sandboxed in this container, so Bastion does not start" in started.stderr
    assert "serving MCP" not in started.stderr


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_bastion_run_serves_a_sandboxed_server_from_a_read_only_root(data: Path, tmp_path: Path, mode: str,
                                                                          monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "config"
    config.mkdir()
    (config / "allow.cedar").write_text('@id("all") permit (principal, action, resource);\n')
    (config / "bastion.json").write_text(json.dumps({
        "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"},
        "policy": {"policy_files": ["allow.cedar"]},
        "servers": {"evil": {"command": sys.executable, "args": [str(MALICIOUS)]}}}))
    monkeypatch.setenv(SECRET, "container-secret")  # in the gateway's environment, never the server's
    command = container(data, extra=["--ro-bind", str(config), "/config", "--setenv", SECRET, "container-secret"])
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errlog:
        parameters = StdioServerParameters(command=command[0], args=[*command[1:], str(ENTRYPOINT), "run",
                                                                      "/config/bastion.json"])
        async with Client(stdio_client(parameters, errlog=errlog), mode=mode, read_timeout_seconds=120) as session:
            async def call(tool: str, **arguments) -> dict:
                result = await session.call_tool(f"evil__{tool}", arguments)
                assert not result.is_error, result
                return json.loads(result.content[0].text)

            environment = await call("environment")
            assert SECRET not in json.dumps(environment)
            processes = await call("list_processes")
            assert not any("/config/bastion.json" in command for command in processes["commands"])  # no gateway: own pids
            assert not (await call("new_user_namespace"))["ok"]  # Bastion's seccomp filter, inside the container
    # What the gateway wrote is on the data volume: the audit trail of the calls above, and nothing else
    # could be written anywhere else (the root is read-only).
    trail = data / "state" / "bastion" / "audit.jsonl"
    assert trail.exists(), stderr.read_text()
    assert "environment" in trail.read_text() and "new_user_namespace" in trail.read_text()


def healthcheck_command(port: int) -> list[str]:
    """The Dockerfile's HEALTHCHECK, for a listener on ``port``."""
    from tests.deploy.dockerfile import DOCKERFILE, stages

    _, (_, runtime) = stages(DOCKERFILE.read_text())
    (health,) = runtime.all("HEALTHCHECK")
    exec_form = health.arguments[health.arguments.index("CMD") + len("CMD"):]
    words = json.loads(exec_form)
    return [words[0], *[w.replace(":8080/", f":{port}/") for w in words[1:]]]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_bastion_serve_in_the_image_conditions_answers_probes_and_clients(data: Path, tmp_path: Path,
                                                                               mode: str):
    import re

    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from tests.support import wait_for

    config = tmp_path / "config"
    config.mkdir()
    (config / "bastion.json").write_text(json.dumps({
        "ready_timeout": READY_TIMEOUT, "tools": {"exposure": "all"}, "policy": "off",
        "servers": {"evil": {"command": sys.executable, "args": [str(MALICIOUS)]}}}))
    stderr = tmp_path / "stderr"
    # The image's default command, on a free loopback port (the emulation shares the host's network).
    process = subprocess.Popen(
        container(data, extra=["--ro-bind", str(config), "/config"])
        + [str(ENTRYPOINT), "serve", "/config/bastion.json", "--http", "127.0.0.1:0", "--log-format", "json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"))
    try:
        found: list[str] = []

        def listening() -> bool:
            match = re.search(r"serving MCP on (http://127\.0\.0\.1:\d+)/mcp", stderr.read_text(errors="replace"))
            found.extend([match.group(1)] if match else [])
            assert process.poll() is None, stderr.read_text()
            return bool(match)

        assert await asyncio.to_thread(wait_for, listening, 120), stderr.read_text()
        base = found[0]
        async with httpx2.AsyncClient(timeout=60) as http:
            assert (await http.get(f"{base}/healthz")).status_code == 200
        # The sandboxed server is starting; readiness follows it.
        assert await asyncio.to_thread(wait_for, lambda: httpx2.get(f"{base}/readyz", timeout=60).status_code == 200,
                                       120), stderr.read_text()
        port = int(base.rpartition(":")[2])
        health = subprocess.run(container(data) + healthcheck_command(port), capture_output=True, text=True,
                                timeout=60)
        assert health.returncode == 0, health.stderr
        async with Client(streamable_http_client(f"{base}/mcp"), mode=mode) as session:
            result = await session.call_tool("evil__new_user_namespace", {})
            assert not result.is_error and not json.loads(result.content[0].text)["ok"]
    finally:
        stop(process)
    # The healthcheck shows failure too: nothing listens there any more.
    assert subprocess.run(container(data) + healthcheck_command(port), capture_output=True,
                          timeout=60).returncode != 0


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_configmaps_configuration_serves_on_a_real_redis_in_the_image_conditions(
        data: Path, tmp_path: Path, mode: str):
    """deploy/kubernetes/configmap.yaml's bastion.toml and team.cedar, as the pod mounts them, with only its
    addresses moved to this machine's loopback (Redis on a free port with a password, the metrics listener on port
    0, the Secret's folder at /keys) and its placeholder remote server replaced by a local sandboxed one (nothing
    leaves loopback): the replica gets ready with its state store answering, refuses a caller without an API key,
    lists for one with a key sent with the Service's host name, and puts a call that is no read (team.cedar) in the
    approval queue for a person."""
    import re
    import secrets

    import httpx2
    import yaml
    from mcp.client.streamable_http import streamable_http_client

    from tests.redis_server import RedisServer, redis_available
    from tests.support import BASTION, FIXTURES, wait_for

    if not redis_available():
        pytest.skip("redis-server is not installed (scripts/setup.sh)")
    manifest = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "configmap.yaml").read_text())
    config = tmp_path / "config"
    config.mkdir()
    for name, text in manifest["data"].items():
        (config / name).write_text(text)
    password = secrets.token_hex(16)
    redis_server = RedisServer(password=password).start()
    toml = (config / "bastion.toml").read_text()
    head, _, placeholder = toml.partition("[servers.docs]")
    assert placeholder and "[" not in placeholder.replace("[servers.docs]", ""), "the placeholder is the last table"
    moved = (head.replace('url = "redis://redis:6379/0"', f'url = "redis://127.0.0.1:{redis_server.port}/0"')
             .replace('listen = "0.0.0.0:9464"', 'listen = "127.0.0.1:0"')
             .replace("/etc/bastion-keys/", "/keys/"))
    assert moved.count("/keys/") == 3 and str(redis_server.port) in moved and "127.0.0.1:0" in moved
    (config / "bastion.toml").write_text(
        moved + f'[servers.raw]\ncommand = "{sys.executable}"\nargs = ["{FIXTURES / "raw_server.py"}"]\n')
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "approval.key").write_text(secrets.token_hex(32))
    (keys / "session.key").write_text(secrets.token_hex(32))
    made = subprocess.run([BASTION, "keys", "create", "alice", "--file", str(keys / "api_keys.json")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    api_key = made.stdout.strip()
    environment = ["--setenv", "REDIS_PASSWORD", password, "--setenv", "BASTION_CREDENTIALS_KEY",
                   secrets.token_hex(32)]
    stderr = tmp_path / "stderr"
    process = subprocess.Popen(
        container(data, extra=["--ro-bind", str(config), "/config", "--ro-bind", str(keys), "/keys", *environment])
        + [str(ENTRYPOINT), "serve", "/config/bastion.toml", "--http", "127.0.0.1:0", "--log-format", "json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr.open("wb"))
    try:
        found: list[str] = []

        def listening() -> bool:
            match = re.search(r"serving MCP on (http://127\.0\.0\.1:\d+)/mcp", stderr.read_text(errors="replace"))
            found.extend([match.group(1)] if match else [])
            assert process.poll() is None, stderr.read_text()
            return bool(match)

        assert await asyncio.to_thread(wait_for, listening, 120), stderr.read_text()
        base = found[0]
        assert await asyncio.to_thread(wait_for, lambda: httpx2.get(f"{base}/readyz", timeout=60).status_code == 200,
                                       120), stderr.read_text()
        assert httpx2.get(f"{base}/readyz", timeout=60).json()["checks"]["state"] == {"ok": True}
        service = {"host": "bastion"}  # as a client in the cluster names the Service
        refused = httpx2.post(f"{base}/mcp", headers=service, timeout=60, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        assert refused.status_code == 401
        http = httpx2.AsyncClient(headers={**service, "authorization": f"Bearer {api_key}"}, timeout=120)
        async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http), mode=mode) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"raw__echo", "raw__slow"} <= names
            # team.cedar: the echo is no read, so it needs a person; over HTTP that is asked out of band: the call
            # waits in the approval queue, kept in Redis for every replica, which `bastion approvals --config`
            # lists from anywhere the configuration and the Redis password are (kubectl exec in a cluster).
            call = asyncio.create_task(session.call_tool("raw__echo", {"text": "hello"}))
            outside = config / "outside.toml"
            outside.write_text((config / "bastion.toml").read_text().replace("/keys/", f"{keys}/"))
            pending: list[dict] = []

            def waiting() -> bool:
                listed = subprocess.run([BASTION, "approvals", "--json", "--config", str(outside)],
                                        capture_output=True, text=True, timeout=60,
                                        env={**os.environ, "REDIS_PASSWORD": password})
                assert listed.returncode == 0, listed.stderr
                pending[:] = json.loads(listed.stdout or "[]")
                assert not call.done(), call
                return bool(pending)

            assert await asyncio.to_thread(wait_for, waiting, 120), stderr.read_text()
            assert [(p["identity"], p["tool"]) for p in pending] == [("alice", "echo")], pending
            call.cancel()
    finally:
        stop(process)
        redis_server.close()
    trail = (data / "state" / "bastion" / "audit.jsonl").read_text()
    assert '"name":"alice"' in trail and "tools/list" in trail
