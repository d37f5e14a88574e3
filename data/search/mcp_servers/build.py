"""Re-create tools.jsonl: install each MCP server, run it offline over stdio, record its tools/list.

Usage (as root, since every server runs inside ``unshare --net`` so it cannot reach the network):

    python build.py [--workdir /tmp/mcp-catalog] [--no-install] [--only SERVER ...]

npm packages are installed with ``npm install --prefix WORKDIR/npm/<server>``, PyPI packages into a
venv at ``WORKDIR/py/<server>`` (``python -m venv`` + pip), at the versions pinned below. Each server is
started with dummy credentials where it insists on some, sent ``initialize`` (protocol version
2025-06-18), ``notifications/initialized`` and ``tools/list`` (following ``nextCursor``), and its tools
are written as served, one row each: ``{"id": "<server>/<tool>", "name", "description", "inputSchema"}``.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOCOL = "2025-06-18"
TIMEOUT = 90.0
DUMMY = "dummy-credential-0000000000000000"


@dataclass
class Server:
    key: str  # catalog prefix
    package: str
    version: str
    licence: str
    kind: str  # "npm" or "pypi"
    bin: str  # npm: bin name under node_modules/.bin; pypi: console script in the venv
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


AWS_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "FASTMCP_LOG_LEVEL": "ERROR",
}

SERVERS: list[Server] = [
    Server("filesystem", "@modelcontextprotocol/server-filesystem", "2026.8.31", "MIT", "npm", "mcp-server-filesystem", ["{scratch}"]),
    Server("memory", "@modelcontextprotocol/server-memory", "2026.8.31", "MIT", "npm", "mcp-server-memory", env={"MEMORY_FILE_PATH": "{scratch}/memory.jsonl"}),
    Server("everything", "@modelcontextprotocol/server-everything", "2026.8.31", "MIT", "npm", "mcp-server-everything", ["stdio"]),
    Server("github", "@modelcontextprotocol/server-github", "2025.4.8", "MIT", "npm", "mcp-server-github", env={"GITHUB_PERSONAL_ACCESS_TOKEN": DUMMY}),
    Server("gitlab", "@modelcontextprotocol/server-gitlab", "2025.4.25", "MIT", "npm", "mcp-server-gitlab", env={"GITLAB_PERSONAL_ACCESS_TOKEN": DUMMY}),
    Server("slack", "@modelcontextprotocol/server-slack", "2025.4.25", "MIT", "npm", "mcp-server-slack", env={"SLACK_BOT_TOKEN": "xoxb-" + DUMMY, "SLACK_TEAM_ID": "T00000000"}),
    Server("google-maps", "@modelcontextprotocol/server-google-maps", "0.6.2", "MIT", "npm", "mcp-server-google-maps", env={"GOOGLE_MAPS_API_KEY": DUMMY}),
    Server("puppeteer", "@modelcontextprotocol/server-puppeteer", "2025.5.12", "MIT", "npm", "mcp-server-puppeteer", env={"PUPPETEER_SKIP_DOWNLOAD": "1"}),
    Server("brave-search", "@modelcontextprotocol/server-brave-search", "0.6.2", "MIT", "npm", "mcp-server-brave-search", env={"BRAVE_API_KEY": DUMMY}),
    Server("postgres", "@modelcontextprotocol/server-postgres", "0.6.2", "MIT", "npm", "mcp-server-postgres", ["postgresql://user:pass@127.0.0.1:5432/db"]),
    Server("sequential-thinking", "@modelcontextprotocol/server-sequential-thinking", "2026.8.31", "MIT", "npm", "mcp-server-sequential-thinking"),
    Server("aws-kb-retrieval", "@modelcontextprotocol/server-aws-kb-retrieval", "0.6.2", "MIT", "npm", "mcp-server-aws-kb-retrieval", env=AWS_ENV),
    Server("playwright", "@playwright/mcp", "0.0.83", "Apache-2.0", "npm", "playwright-mcp"),
    Server("chrome-devtools", "chrome-devtools-mcp", "1.11.0", "Apache-2.0", "npm", "chrome-devtools-mcp", ["--no-usage-statistics"]),
    Server("notion", "@notionhq/notion-mcp-server", "2.5.2", "MIT", "npm", "notion-mcp-server", env={"NOTION_TOKEN": "ntn_" + DUMMY}),
    Server("mongodb", "mongodb-mcp-server", "3.0.4", "Apache-2.0", "npm", "mongodb-mcp-server", env={"MDB_MCP_API_CLIENT_ID": DUMMY, "MDB_MCP_API_CLIENT_SECRET": DUMMY, "MDB_MCP_TELEMETRY": "disabled", "DO_NOT_TRACK": "1"}),
    Server("kubernetes", "mcp-server-kubernetes", "4.1.7", "MIT", "npm", "mcp-server-kubernetes", env={"KUBECONFIG": "{scratch}/kubeconfig"}),
    Server("stripe", "@stripe/mcp", "0.2.5", "MIT", "npm", "mcp", ["--tools=all", "--api-key=sk_test_" + DUMMY]),
    Server("neon", "@neondatabase/mcp-server-neon", "0.3.7", "MIT", "npm", "mcp-server-neon", ["start", DUMMY]),
    Server("firecrawl", "firecrawl-mcp", "3.22.2", "MIT", "npm", "firecrawl-mcp", env={"FIRECRAWL_API_KEY": "fc-" + DUMMY}),
    Server("tavily", "tavily-mcp", "0.2.22", "MIT", "npm", "tavily-mcp", env={"TAVILY_API_KEY": "tvly-" + DUMMY}),
    Server("exa", "exa-mcp-server", "3.4.1", "MIT", "npm", "exa-mcp-server", env={"EXA_API_KEY": DUMMY}),
    Server("desktop-commander", "@wonderwhy-er/desktop-commander", "0.2.52", "MIT", "npm", "desktop-commander"),
    Server("context7", "@upstash/context7-mcp", "4.1.1", "MIT", "npm", "context7-mcp"),
    Server("elasticsearch", "@elastic/mcp-server-elasticsearch", "0.3.1", "Apache-2.0", "npm", "mcp-server-elasticsearch", env={"ES_URL": "http://127.0.0.1:9200", "ES_API_KEY": DUMMY}),
    Server("hubspot", "@hubspot/mcp-server", "0.4.0", "MIT", "npm", "mcp-hubspot", env={"PRIVATE_APP_ACCESS_TOKEN": "pat-" + DUMMY}),
    Server("figma", "figma-developer-mcp", "0.13.2", "MIT", "npm", "figma-developer-mcp", ["--stdio", "--figma-api-key=" + DUMMY]),
    Server("git", "mcp-server-git", "2026.10.19", "MIT", "pypi", "mcp-server-git", ["--repository", "{scratch}/repo"]),
    Server("fetch", "mcp-server-fetch", "2026.10.24", "MIT", "pypi", "mcp-server-fetch"),
    Server("time", "mcp-server-time", "2026.10.19", "MIT", "pypi", "mcp-server-time", ["--local-timezone", "UTC"]),
    Server("aws-documentation", "awslabs.aws-documentation-mcp-server", "1.2.3", "Apache-2.0", "pypi", "awslabs.aws-documentation-mcp-server", env=AWS_ENV),
    Server("aws-pricing", "awslabs.aws-pricing-mcp-server", "1.1.1", "Apache-2.0", "pypi", "awslabs.aws-pricing-mcp-server", env=AWS_ENV),
    Server("aws-location", "awslabs.aws-location-mcp-server", "2.1.1", "Apache-2.0", "pypi", "awslabs.aws-location-mcp-server", env=AWS_ENV),
    Server("cloudwatch", "awslabs.cloudwatch-mcp-server", "0.3.1", "Apache-2.0", "pypi", "awslabs.cloudwatch-mcp-server", env=AWS_ENV),
    Server("cloudtrail", "awslabs.cloudtrail-mcp-server", "0.1.1", "Apache-2.0", "pypi", "awslabs.cloudtrail-mcp-server", env=AWS_ENV),
    Server("dynamodb", "awslabs.dynamodb-mcp-server", "2.1.8", "Apache-2.0", "pypi", "awslabs.dynamodb-mcp-server", env=AWS_ENV),
    Server("iam", "awslabs.iam-mcp-server", "1.1.2", "Apache-2.0", "pypi", "awslabs.iam-mcp-server", env=AWS_ENV),
]


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def install(server: Server, workdir: Path) -> None:
    if server.kind == "npm":
        prefix = workdir / "npm" / server.key
        prefix.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PUPPETEER_SKIP_DOWNLOAD="1", PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1")
        cmd = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--ignore-scripts", f"{server.package}@{server.version}"]
    else:
        venv = workdir / "py" / server.key
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = dict(os.environ)
        cmd = [str(venv / "bin" / "pip"), "install", "-q", f"{server.package}=={server.version}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{server.key}: install failed: {done.stderr[-2000:]}")
    log(f"installed {server.package} {server.version}")


def executable(server: Server, workdir: Path) -> list[str]:
    if server.kind == "npm":
        return [shutil.which("node") or "node", str((workdir / "npm" / server.key / "node_modules" / ".bin" / server.bin).resolve())]
    return [str(workdir / "py" / server.key / "bin" / server.bin)]


class Session:
    """A JSON-RPC conversation over a child's stdin/stdout, newline-delimited."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.buf = b""

    def send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, msg_id: int, deadline: float) -> dict:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # a log line written to stdout
                if isinstance(message, dict) and message.get("id") == msg_id and ("result" in message or "error" in message):
                    return message
                if isinstance(message, dict) and "method" in message and "id" in message:
                    # a request from the server (roots/list, ping...): answer with an empty result
                    self.send({"jsonrpc": "2.0", "id": message["id"], "result": {"roots": []} if message["method"] == "roots/list" else {}})
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to request {msg_id}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError(f"server closed stdout (exit {self.proc.poll()})")
                self.buf += chunk


def harvest(server: Server, workdir: Path) -> list[dict]:
    # a fixed path: a server may name its working directory in a description (figma does)
    scratch = Path("/tmp/mcp-run") / server.key
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    (scratch / "kubeconfig").write_text(KUBECONFIG)
    if server.key == "git":
        subprocess.run(["git", "init", "-q", str(scratch / "repo")], check=True)
    fill = lambda s: s.replace("{scratch}", str(scratch))  # noqa: E731
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM")}
    env.update(HOME=str(scratch), TMPDIR=str(scratch), NO_COLOR="1", DO_NOT_TRACK="1")
    env.update({k: fill(v) for k, v in server.env.items()})
    cmd = ["unshare", "--net", "--", *executable(server, workdir), *[fill(a) for a in server.args]]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(scratch / "stderr.log", "wb"), env=env, cwd=scratch)
    session = Session(proc)
    deadline = time.monotonic() + TIMEOUT
    try:
        session.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "catalog-build", "version": "1.0"}}})
        init = session.wait_for(1, deadline)
        if "error" in init:
            raise RuntimeError(f"initialize failed: {init['error']}")
        session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools: list[dict] = []
        cursor = None
        msg_id = 2
        while True:
            params = {"cursor": cursor} if cursor else {}
            session.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/list", "params": params})
            answer = session.wait_for(msg_id, deadline)
            if "error" in answer:
                raise RuntimeError(f"tools/list failed: {answer['error']}")
            tools.extend(answer["result"].get("tools", []))
            cursor = answer["result"].get("nextCursor")
            msg_id += 1
            if not cursor:
                break
        return tools
    except Exception as exc:
        err = (scratch / "stderr.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{server.key}: {exc}\n{err}") from exc
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
  name: local
contexts:
- context: {cluster: local, user: local}
  name: local
current-context: local
users:
- name: local
  user: {token: dummy}
"""


def row(server: Server, tool: dict) -> dict:
    return {
        "id": f"{server.key}/{tool['name']}",
        "name": tool["name"],
        "description": tool.get("description") or "",
        "inputSchema": tool.get("inputSchema") or {},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mcp-catalog")
    parser.add_argument("--no-install", action="store_true", help="reuse packages already installed in --workdir")
    parser.add_argument("--only", nargs="*", help="harvest only these servers (prints counts, writes nothing)")
    parser.add_argument("--out", type=Path, default=HERE / "tools.jsonl")
    opts = parser.parse_args()
    servers = [s for s in SERVERS if not opts.only or s.key in opts.only]
    if not opts.no_install:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda s: install(s, opts.workdir), servers))
    rows: list[dict] = []
    failed = []
    for server in servers:
        try:
            tools = harvest(server, opts.workdir)
        except Exception as exc:  # report and go on: one broken server should not lose the others
            log(f"FAILED {exc}")
            failed.append(server.key)
            continue
        log(f"{server.key}: {len(tools)} tools")
        rows.extend(row(server, t) for t in tools)
    ids = [r["id"] for r in rows]
    if len(ids) != len(set(ids)):
        raise SystemExit("duplicate tool ids")
    log(f"{len(rows)} tools from {len(servers) - len(failed)} servers; failed: {failed or 'none'}")
    if opts.only:
        return 1 if failed else 0
    if failed:
        return 1
    with opts.out.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    log(f"wrote {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
