"""How many times a person is asked in a realistic session of ten calls, counted through ``bastion run`` on the
files users really have: the stock Claude Desktop file (filesystem, memory, everything through ``npx -y``), a
Cursor-style file (sequential-thinking, memory, everything through ``npx -y``; fetch through ``uvx``, and sqlite),
and each of them after ``bastion import``. The table in docs/policy.md is these counts.

The client is the official SDK's stdio client started the way clients start servers (their small environment, plus
the test folders and the package clients' offline switches), and it declares elicitation: every prompt reaches it
as an ``elicitation/create``, counted and accepted; a call waiting in the out-of-band queue instead is counted too.

The packages are the real ones, installed offline from the caches scripts/setup.sh fills, but for two local
stand-ins with the same tool names and annotations as the real servers: ``mcp-server-sqlite``'s newest release does
not start with the newest ``mcp``, so tests/fixtures/sqlite_server.py runs as its console script; and no published
mail server is cached offline, so the email-and-web session adds tests/fixtures/mail_server.py. Fetch runs sandboxed
without a network grant, so its page is an error text: what matters here is that the answer came from the server of
the open web.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import ElicitResult, TextContent

from tests.support import BASTION, FIXTURES, ROOT

# slow: each session installs real packages and starts five or six servers
pytestmark = [pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning"), pytest.mark.slow]

WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
DEADLINE = 600.0  # installs and five or six servers starting on a busy 2-core machine; never a measured duration
MAIL = FIXTURES / "mail_server.py"
SQLITE = FIXTURES / "sqlite_server.py"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state folder for the module: packages are installed once, and the approval queue is this module's."""
    for wheel in ("mcp_server_fetch",):
        if not any(WHEELHOUSE.glob(f"{wheel}-*.whl")):
            pytest.fail(f"{WHEELHOUSE} has no {wheel} wheel: run scripts/setup.sh")
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def shared(state: Path) -> Path:
    """The module's data and programs, in one place for every test: tool pinning keys a server's configuration entry
    by its name for the whole user, so the same server started with another folder would be withheld as changed."""
    folder = state.parent / "shared"
    if not folder.exists():
        folder.mkdir()
        data(folder)
        sqlite_console_script(folder)
    return folder


def npx(package: str, *args: str) -> dict:
    return {"command": "npx", "args": ["-y", package, *args]}


def uvx(package: str, *args: str) -> dict:
    return {"command": "uvx", "args": [package, *args]}


@dataclass
class Data:
    folder: Path
    database: Path


def data(root: Path) -> Data:
    folder = root / "project"
    if folder.exists():
        return Data(folder, root / "db" / "shop.db")
    (folder / "src").mkdir(parents=True)
    (folder / "README.md").write_text("# Project\n")
    (folder / "src" / "app.py").write_text("print('hello')\n")
    database = root / "db" / "shop.db"
    database.parent.mkdir()
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        db.execute("INSERT INTO orders (item) VALUES ('book'), ('lamp')")
    return Data(folder, database)


def claude_file(root: Path, d: Data, *, web: bool) -> Path:
    servers = {
        "filesystem": npx("@modelcontextprotocol/server-filesystem", str(d.folder)),
        "memory": npx("@modelcontextprotocol/server-memory"),
        "everything": npx("@modelcontextprotocol/server-everything"),
    }
    if web:
        servers |= {"fetch": uvx("mcp-server-fetch"), "mail": {"command": sys.executable, "args": [str(MAIL)]}}
    return write(root / "claude" / "claude_desktop_config.json", servers)


def cursor_file(root: Path, d: Data, *, web: bool) -> Path:
    servers = {
        "sequential-thinking": npx("@modelcontextprotocol/server-sequential-thinking"),
        "memory": npx("@modelcontextprotocol/server-memory"),
        "everything": npx("@modelcontextprotocol/server-everything"),
        "fetch": uvx("mcp-server-fetch"),
        "sqlite": {"command": str(sqlite_console_script(d.folder.parent)), "args": ["--db-path", str(d.database)]},
    }
    if web:
        servers["mail"] = {"command": sys.executable, "args": [str(MAIL)]}
    return write(root / "cursor" / "mcp.json", servers)


def sqlite_console_script(root: Path) -> Path:
    """``mcp-server-sqlite`` as pip installs it (a console script in an environment's bin), running the stand-in:
    the release on PyPI does not start with the newest ``mcp`` (tests/fixtures/sqlite_server.py)."""
    script = root / "venv" / "bin" / "mcp-server-sqlite"
    if script.exists():
        return script
    script.parent.mkdir(parents=True, exist_ok=True)
    # The stand-in's own text: the sandbox shows a server the program it runs, not the test's folder.
    script.write_text(f"#!{sys.executable}\n{SQLITE.read_text()}")
    script.chmod(0o755)
    return script


def write(path: Path, servers: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Every tool listed, so the session calls them by name (five servers are past the default exposure's bound).
    path.write_text(json.dumps({"mcpServers": servers, "tools": {"exposure": "all"}}, indent=2))
    return path


def environment(state: Path) -> dict[str, str]:
    """What joins the SDK's small environment: the test's state and cache folders and the package clients' own
    offline switches (npm from its cache, pip from the wheelhouse)."""
    return {"XDG_STATE_HOME": str(state), "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"],
            "npm_config_offline": "true", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}


def imported(client_file: Path, state: Path) -> Path:
    """``bastion import`` of the client file, as a person runs it, with the listing of every tool added."""
    output = client_file.with_name("bastion.toml")
    done = subprocess.run([BASTION, "import", str(client_file), "--output", str(output), "-q"],
                          env={**os.environ, **environment(state)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = output.read_text()
    assert "[tools]" not in text
    output.write_text(text.replace("[servers.", '[tools]\nexposure = "all"\n\n[servers.', 1))
    return output


@dataclass
class Person:
    """Answers every prompt with yes, and keeps what it was asked."""

    asked: list[str] = field(default_factory=list)

    async def on_elicitation(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": True})


@dataclass
class Counted:
    prompts: list[str]  # each prompt's text, in order
    queued: int  # calls that waited in the out-of-band queue without a prompt in the client
    answers: dict[str, str]  # tool -> the text of its last answer


def queue_entries(state: Path) -> set[str]:
    queue = state / "bastion" / "approvals"
    return {path.name for path in queue.glob("*.json")} if queue.exists() else set()


async def run_session(config: Path, state: Path, calls: list[tuple[str, dict]]) -> Counted:
    person = Person()
    before = queue_entries(state)
    answers: dict[str, str] = {}
    params = StdioServerParameters(command=BASTION, args=["run", str(config), "-q"], env=environment(state))
    with anyio.fail_after(DEADLINE):
        async with Client(params, mode="legacy", read_timeout_seconds=DEADLINE,
                          elicitation_callback=person.on_elicitation) as session:
            wanted = {name.split("__", 1)[0] for name, _ in calls}
            while True:  # servers still installing join later, with list_changed
                listed = await session.list_tools(cache_mode="bypass")  # servers join while it lists
                if wanted <= {tool.name.split("__", 1)[0] for tool in listed.tools}:
                    break
                await anyio.sleep(0.5)
            for name, arguments in calls:
                result = await session.call_tool(name, arguments)
                answers[name] = "".join(b.text for b in result.content if isinstance(b, TextContent))
                assert not result.is_error or name == "fetch__fetch", (name, answers[name])
    # A legacy client that takes elicitation is asked in the client, the queue request beside it closed by the answer.
    queued = [json.loads((state / "bastion" / "approvals" / entry).read_text())
              for entry in queue_entries(state) - before]
    out_of_band = [record for record in queued if record.get("reason") != "answered in the client"
                   and "answered in the client" not in json.dumps(record)]
    return Counted(person.asked, len(out_of_band), answers)


def coding_session_claude(d: Data) -> list[tuple[str, dict]]:
    """Read-mostly: list, read and search the project, look at the memory, one memory write."""
    return [
        ("filesystem__list_directory", {"path": str(d.folder)}),
        ("filesystem__read_text_file", {"path": str(d.folder / "README.md")}),
        ("filesystem__search_files", {"path": str(d.folder), "pattern": "*.py"}),
        ("filesystem__get_file_info", {"path": str(d.folder / "src" / "app.py")}),
        ("memory__read_graph", {}),
        ("everything__echo", {"message": "status"}),
        ("everything__get-sum", {"a": 2, "b": 3}),
        ("memory__create_entities", {"entities": [{"name": "app", "entityType": "project",
                                                   "observations": ["prints hello"]}]}),
        ("memory__search_nodes", {"query": "app"}),
        ("filesystem__directory_tree", {"path": str(d.folder)}),
    ]


def coding_session_cursor(d: Data) -> list[tuple[str, dict]]:
    """Read-mostly: think, look at the database, the memory, one memory write."""
    think = {"thought": "Look at the orders table first.", "nextThoughtNeeded": True, "thoughtNumber": 1,
             "totalThoughts": 2}
    return [
        ("sequential-thinking__sequentialthinking", think),
        ("sqlite__list_tables", {}),
        ("sqlite__describe_table", {"table_name": "orders"}),
        ("sqlite__read_query", {"query": "SELECT item FROM orders"}),
        ("memory__read_graph", {}),
        ("everything__echo", {"message": "status"}),
        ("sequential-thinking__sequentialthinking", {**think, "thought": "Two orders.", "thoughtNumber": 2,
                                                     "nextThoughtNeeded": False}),
        ("memory__create_entities", {"entities": [{"name": "shop", "entityType": "database",
                                                   "observations": ["two orders"]}]}),
        ("memory__open_nodes", {"names": ["shop"]}),
        ("everything__get-sum", {"a": 2, "b": 3}),
    ]


def web_session(d: Data, reads: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Email and web: fetch a page (content anyone wrote), read mail, other reads, then one destructive call."""
    return [
        ("fetch__fetch", {"url": "http://127.0.0.1:9/notes"}),
        ("mail__list_messages", {}),
        ("mail__read_message", {"message_id": "m2"}),
        *reads,
        ("mail__read_message", {"message_id": "m1"}),
        ("mail__send_message", {"to": "stranger@example.net", "subject": "Re: Invoice", "body": "Received."}),
    ]


SENT = "mail__send_message"


def claude_reads(d: Data) -> list[tuple[str, dict]]:
    return [("filesystem__read_text_file", {"path": str(d.folder / "README.md")}), ("memory__read_graph", {}),
            ("everything__echo", {"message": "noted"}), ("filesystem__list_directory", {"path": str(d.folder)}),
            ("memory__search_nodes", {"query": "invoice"})]


def cursor_reads(d: Data) -> list[tuple[str, dict]]:
    return [("sqlite__read_query", {"query": "SELECT item FROM orders"}), ("memory__read_graph", {}),
            ("everything__echo", {"message": "noted"}), ("sqlite__list_tables", {}),
            ("memory__search_nodes", {"query": "invoice"})]


def assert_asked_only_about_the_send(counted: Counted) -> None:
    [prompt] = counted.prompts
    assert "send_message" in prompt and "could steer the model" in prompt, prompt  # named what it read first
    assert counted.queued == 0
    assert counted.answers[SENT] == "sent to stranger@example.net"


@pytest.mark.parametrize("kind", ["claude", "cursor"])
def test_a_read_mostly_coding_session_asks_once_for_its_one_write(kind: str, state: Path, shared: Path,
                                                                  tmp_path: Path) -> None:
    d = data(shared)
    client_file = (claude_file if kind == "claude" else cursor_file)(tmp_path, d, web=False)
    calls = (coding_session_claude if kind == "claude" else coding_session_cursor)(d)
    for config in (client_file, imported(client_file, state)):
        counted = anyio.run(run_session, config, state, calls)
        [prompt] = counted.prompts
        assert "create_entities" in prompt, (config.name, counted.prompts)
        assert counted.queued == 0
        assert "orders" in counted.answers.get("sqlite__list_tables", "orders")
        assert "app" in counted.answers.get("memory__search_nodes", "app")


@pytest.mark.parametrize("kind", ["claude", "cursor"])
def test_an_email_and_web_session_asks_about_its_destructive_call_after_untrusted_content(
        kind: str, state: Path, shared: Path, tmp_path: Path) -> None:
    d = data(shared)
    client_file = (claude_file if kind == "claude" else cursor_file)(tmp_path, d, web=True)
    calls = web_session(d, (claude_reads if kind == "claude" else cursor_reads)(d))
    assert len(calls) == 10
    for config in (client_file, imported(client_file, state)):
        assert_asked_only_about_the_send(anyio.run(run_session, config, state, calls))


EVERYTHING_READS = ["echo", "get-sum", "get-tiny-image", "get-annotated-message", "get-structured-content",
                    "get-resource-links", "get-resource-reference", "trigger-long-running-operation", "get-env",
                    "get-roots-list"]


def benign_arguments(schema: dict) -> dict:
    """The required arguments of a tool, each the first value its schema allows (an enum's first, a number's
    minimum or 1, a short text)."""
    arguments: dict[str, Any] = {}
    for name in schema.get("required", []):
        spec = schema.get("properties", {}).get(name, {})
        if "enum" in spec:
            arguments[name] = spec["enum"][0]
        elif spec.get("type") in ("integer", "number"):
            arguments[name] = spec.get("minimum", 1)
        elif spec.get("type") == "boolean":
            arguments[name] = False
        else:
            arguments[name] = "hello"
    return arguments


def test_the_newer_defaults_neither_ask_nor_refuse_a_benign_call_of_server_everything(
        state: Path, shared: Path, tmp_path: Path) -> None:
    # undeclared_arguments = "refuse_untrusted", flow, argument_secrets and elicitation on, as a plain file runs.
    config = claude_file(tmp_path, data(shared), web=False)

    async def session() -> tuple[list[str], dict[str, str]]:
        person = Person()
        answers: dict[str, str] = {}
        params = StdioServerParameters(command=BASTION, args=["run", str(config), "-q"], env=environment(state))
        with anyio.fail_after(DEADLINE):
            async with Client(params, mode="legacy", read_timeout_seconds=DEADLINE,
                              elicitation_callback=person.on_elicitation) as client:
                while True:
                    listed = (await client.list_tools(cache_mode="bypass")).tools
                    tools = {t.name: t for t in listed if t.name.startswith("everything__")}
                    if tools:
                        break
                    await anyio.sleep(0.5)
                for short in EVERYTHING_READS:
                    tool = tools.get(f"everything__{short}")
                    assert tool is not None, sorted(tools)
                    result = await client.call_tool(tool.name, benign_arguments(tool.input_schema))
                    answers[short] = "".join(b.text for b in result.content if isinstance(b, TextContent))
                    assert not result.is_error, (short, answers[short])
        return person.asked, answers

    asked, answers = anyio.run(session)
    assert asked == []
    assert "hello" in answers["echo"] and "2" in answers["get-sum"]
