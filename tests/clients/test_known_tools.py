"""What Bastion counts as a read and as tainting content without believing the server (bastion/clients/known_tools.py),
and how the policy's tool facts and the taint guardrail read it: pure decisions, no process."""

from __future__ import annotations

from bastion.clients.known_tools import (ServerNature, claims_read_only, name_words, reads_only, reference_of,
                                         server_nature)
from bastion.config import ServerConfig
from bastion.gateway.catalog import Catalog, ServerFacts
from bastion.gateway.core import launched_package
from bastion.guardrails.flow import sends_out
from bastion.guardrails.taint import content_origin, read_only
from bastion.policy.cedar_engine import ToolFacts


def definition(name: str, **hints: bool) -> dict:
    return {"name": name, "inputSchema": {"type": "object"}, "annotations": hints}


def nature(command: str, *args: str, **settings) -> ServerNature:
    options = {"remote": False, "sandboxed": True, "network": (), "marked_untrusted": False, "pinned": True,
               **settings}
    launched = launched_package(ServerConfig(command=command, args=list(args)))
    return server_nature(command=command, args=list(args), launched=launched, **options)


def test_a_reference_package_is_known_by_how_it_is_started() -> None:
    assert reference_of("npx", ["-y", "@modelcontextprotocol/server-filesystem@2026.8.31", "/data"],
                        "@modelcontextprotocol/server-filesystem") is not None
    assert reference_of("uvx", ["mcp-server-git", "--repository", "/src"], "mcp-server-git") is not None
    assert reference_of("/home/u/.venv/bin/mcp-server-time", []) is not None
    assert reference_of("node", ["/x/node_modules/@modelcontextprotocol/server-memory/dist/index.js"]) is not None
    assert reference_of("python", ["server.py"]) is None


def test_a_reference_packages_reads_count_whatever_the_server_claims() -> None:
    files = nature("npx", "-y", "@modelcontextprotocol/server-filesystem", "/data")
    assert reads_only(files, definition("read_text_file"), "read_text_file")  # no annotation needed
    # A write stays a write even when the server (or someone in its place) calls it read-only
    assert not reads_only(files, definition("write_file"), "write_file")
    git = nature("uvx", "mcp-server-git")
    assert reads_only(git, definition("git_status"), "git_status")
    assert not reads_only(git, definition("git_commit"), "git_commit")


def test_a_plausible_read_claim_counts_only_while_pinning_holds_it() -> None:
    claimed = definition("read_message", readOnlyHint=True, openWorldHint=True)
    assert reads_only(nature("python", "mail.py"), claimed, "read_message")
    assert not reads_only(nature("python", "mail.py", pinned=False), claimed, "read_message")
    # A name that says change, or a claim that contradicts itself, is no read
    for name in ("send_message", "deleteMessage", "push-branch", "write", "setConfig"):
        assert not claims_read_only(definition(name, readOnlyHint=True)), name
    assert not claims_read_only(definition("read_message", readOnlyHint=True, destructiveHint=True))
    assert not claims_read_only(definition("read_message"))
    assert name_words("sendEmail") == ["send", "email"] and name_words("HTTPGet_v2") == ["http", "get", "v", "2"]


def test_what_taints_is_where_content_comes_from() -> None:
    assert nature("uvx", "mcp-server-time").taints is None
    assert nature("uvx", "mcp-server-git").taints is None
    assert nature("python", "local.py").taints is None  # a local server nobody reviewed: only flagged content
    assert nature("uvx", "mcp-server-fetch").taints == "it fetches content others wrote"
    assert nature("python", "s.py", network=("api.example.com:443",)).taints == "its sandbox grants it the network"
    assert "unconfined" in (nature("python", "s.py", sandboxed=False).taints or "")
    assert nature("x", remote=True).taints == "a remote server"
    assert nature("uvx", "mcp-server-time", marked_untrusted=True).taints == "untrusted server"


def catalog_of(**servers: ServerFacts) -> Catalog:
    return Catalog(list(servers.values()))


def test_the_catalog_hands_the_policy_and_the_guardrails_one_answer() -> None:
    time_nature = nature("uvx", "mcp-server-time")
    catalog = catalog_of(
        time=ServerFacts("time", "time", "untrusted", time_nature),
        fetch=ServerFacts("fetch", "fetch", "untrusted", nature("uvx", "mcp-server-fetch"),
                          frozenset({"fetch"})))
    catalog.update("time", "tools", [definition("get_current_time"), definition("set_timezone", readOnlyHint=True)])
    catalog.update("fetch", "tools", [definition("fetch", readOnlyHint=True, openWorldHint=True)])
    current = catalog.tool("time__get_current_time")
    assert current is not None and current.reads_only and read_only(current)
    assert ToolFacts.of(current).read_only and not ToolFacts.of(current).destructive
    assert not ToolFacts.of(current).annotations_trusted  # the server's own claims still count for nothing
    setter = catalog.tool("time__set_timezone")
    assert setter is not None and not read_only(setter) and not ToolFacts.of(setter).read_only
    fetch = catalog.tool("fetch__fetch")
    assert fetch is not None and fetch.pre_approved and not current.pre_approved
    assert content_origin(catalog, "time") is None
    assert content_origin(catalog, "fetch") == "it fetches content others wrote"
    # A value from another server's answers is held only on its way to a server it could leave the machine through
    assert sends_out(catalog, fetch) and not sends_out(catalog, current)


def test_a_launcher_is_known_by_its_own_package_not_by_a_name_among_its_arguments() -> None:
    def known(command: str, *args: str) -> bool:
        server = ServerConfig(command=command, args=list(args))
        return reference_of(command, args, launched_package(server)) is not None

    assert known("npx", "-y", "@modelcontextprotocol/server-filesystem", "/data")
    assert known("uvx", "mcp-server-time", "--local-timezone", "UTC")
    assert known("/usr/bin/mcp-server-time")
    # Another package given a reference server's name as an argument reads as no reference at all.
    assert not known("npx", "-y", "some-scraper", "@modelcontextprotocol/server-filesystem")
    assert not known("uvx", "web-scraper", "mcp-server-time")
    assert not known("npx", "-c", "@modelcontextprotocol/server-filesystem")  # a form not read: not known
