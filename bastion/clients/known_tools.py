"""What Bastion knows about a server's tools without believing the server: which of them only read, and whether
what the server answers comes from the open world (content someone else wrote, which may steer the model).

An untrusted server's annotations are its own claims, so they cannot decide alone that a call needs no person.
Two things can:

- **Reference packages**: for a published server started by its package name (``npx -y @modelcontextprotocol/
  server-filesystem``, ``uvx mcp-server-git``), Bastion's own list of the tools that package ships that only read.
  The tool's name is checked against that list, never against what the server says about it.
- **A plausible claim, held still**: ``readOnlyHint: true`` (without ``destructiveHint: true``) on a tool whose
  name says no change (no word such as write, delete, send), believed only while tool pinning holds the server's
  definitions to the ones first seen, so a claim raised later is withheld until a person accepts it.

A false read-only claim gains a server nothing it could not do on any call it gets (it runs its own code either
way); the prompt is there to stop a *model* from changing things unasked, and the name check keeps a careless
annotation on a tool that plainly writes from passing as a read.

Pure: it reads only the configuration's words (command, arguments, sandbox grants) and the tool definitions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bastion.clients.grants import package_name


@dataclass(frozen=True, slots=True)
class Reference:
    """A published server: its package names, the tools it ships that only read, and whether it fetches content
    others wrote (the web, mail, issues) whatever its sandbox grants say."""

    names: frozenset[str]
    reads: frozenset[str]
    open_world: bool = False


REFERENCES: tuple[Reference, ...] = (
    Reference(frozenset({"@modelcontextprotocol/server-filesystem", "mcp-server-filesystem"}), frozenset({
        "read_file", "read_text_file", "read_media_file", "read_multiple_files", "list_directory",
        "list_directory_with_sizes", "directory_tree", "search_files", "get_file_info", "list_allowed_directories"})),
    Reference(frozenset({"@modelcontextprotocol/server-memory", "mcp-server-memory"}),
              frozenset({"read_graph", "search_nodes", "open_nodes"})),
    Reference(frozenset({"mcp-server-git", "mcp_server_git"}), frozenset({
        "git_status", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_log", "git_show", "git_branch"})),
    Reference(frozenset({"mcp-server-time", "mcp_server_time"}), frozenset({"get_current_time", "convert_time"})),
    Reference(frozenset({"mcp-server-sqlite", "mcp_server_sqlite"}),
              frozenset({"read_query", "list_tables", "describe_table"})),
    # Its one tool keeps the model's own chain of thoughts in the server's memory: nothing outside changes.
    Reference(frozenset({"@modelcontextprotocol/server-sequential-thinking", "mcp-server-sequential-thinking"}),
              frozenset({"sequentialthinking"})),
    # The protocol's test server: these return what they are given or canned data, and change nothing.
    Reference(frozenset({"@modelcontextprotocol/server-everything", "mcp-server-everything"}), frozenset({
        "echo", "get-sum", "get-tiny-image", "get-annotated-message", "get-resource-links", "get-resource-reference",
        "get-structured-content", "get-roots-list", "trigger-long-running-operation",
        # the names of its earlier releases
        "add", "longRunningOperation", "getTinyImage", "annotatedMessage", "getResourceReference",
        "getResourceLinks", "structuredContent", "listRoots"})),
    # Fetching a page changes nothing, but it is how content of the open web comes in: what it answers taints the
    # session, and a value from another server's answers in its arguments (a URL is how data goes out) is held by
    # the flow guardrail.
    Reference(frozenset({"mcp-server-fetch", "mcp_server_fetch", "@modelcontextprotocol/server-puppeteer",
                         "@playwright/mcp", "@modelcontextprotocol/server-brave-search"}), frozenset({"fetch"}), True),
    Reference(frozenset({"@modelcontextprotocol/server-github", "@modelcontextprotocol/server-gitlab",
                         "@modelcontextprotocol/server-slack", "@notionhq/notion-mcp-server"}), frozenset(), True),
)


def reference_of(command: str | None, args: Sequence[str], launched: str | None = None) -> Reference | None:
    """The reference package ``command args`` starts: ``launched``, the package a launcher runs (``npx -y PKG``,
    ``uvx PKG``), when it is one; else the first token that names one (``python -m MOD``, a path into its
    ``node_modules`` or its executable)."""
    # A launcher runs its package; a reference name among the server's own arguments is no evidence of what runs.
    tokens = (launched,) if launched is not None else (command or "", *args)
    for token in tokens:
        package = package_name(str(token))
        for reference in REFERENCES:
            if package in reference.names:
                return reference
    return None


# Words in a tool's name that say it changes something: a tool so named is no read whatever it claims.
_CHANGE_WORDS = frozenset({
    "add", "append", "apply", "approve", "archive", "assign", "cancel", "checkout", "clear", "close", "commit",
    "create", "delete", "deploy", "destroy", "disable", "drop", "edit", "enable", "exec", "execute", "grant",
    "insert", "install", "invite", "kill", "merge", "modify", "move", "pay", "post", "publish", "purge", "push",
    "put", "remove", "rename", "replace", "reset", "restart", "revoke", "rm", "run", "save", "send", "set",
    "shutdown", "start", "stop", "store", "submit", "toggle", "transfer", "trigger", "truncate", "uninstall",
    "update", "upload", "upsert", "write",
})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def name_words(name: str) -> list[str]:
    """``sendEmail``, ``send_email``, ``send-email`` -> ``["send", "email"]``."""
    return [word.lower() for word in _WORD.findall(name)]


def names_a_change(name: str) -> bool:
    return any(word in _CHANGE_WORDS for word in name_words(name))


def claims_read_only(definition: Mapping[str, Any]) -> bool:
    """The tool says it only reads, consistently, and its name does not say otherwise."""
    annotations = definition.get("annotations")
    if not isinstance(annotations, Mapping) or annotations.get("readOnlyHint") is not True:
        return False
    if annotations.get("destructiveHint") is True:
        return False
    name = definition.get("name")
    return isinstance(name, str) and not names_a_change(name)


def claims_open_world(definition: Mapping[str, Any]) -> bool:
    """The tool says it reaches the open world: a claim that asks for more care, so believed from anyone."""
    annotations = definition.get("annotations")
    # dict, not Mapping: a definition is parsed JSON, and this runs for every answer, where an isinstance against
    # typing's Mapping costs five calls through the ABC machinery
    return isinstance(annotations, dict) and annotations.get("openWorldHint") is True


@dataclass(frozen=True, slots=True)
class ServerNature:
    """What one configured server's tools and answers are, as far as Bastion can tell without believing it."""

    reads: frozenset[str] = frozenset()  # tool names (the server's own) known to only read
    believes_read_claims: bool = False  # a plausible read-only claim of its tools counts (pinning holds it)
    taints: str | None = None  # why everything it answers may steer the model; None: only what the scan flags


def server_nature(*, command: str | None, args: Sequence[str], launched: str | None, remote: bool, sandboxed: bool, network: Sequence[str],
                  marked_untrusted: bool, pinned: bool) -> ServerNature:
    """A server's nature from how it is configured: its package, its sandbox grants, the user's mark."""
    reference = None if remote else reference_of(command, args, launched)
    return ServerNature(
        reads=reference.reads if reference is not None else frozenset(),
        believes_read_claims=pinned,
        taints=_why_it_taints(reference, remote, sandboxed, network, marked_untrusted),
    )


def _why_it_taints(reference: Reference | None, remote: bool, sandboxed: bool, network: Sequence[str],
                   marked_untrusted: bool) -> str | None:
    if marked_untrusted:
        return "untrusted server"  # the user's own mark: trust = "untrusted" written in the configuration
    if remote:
        return "a remote server"
    if reference is not None and reference.open_world:
        return "it fetches content others wrote"
    if not sandboxed:
        return 'it runs unconfined (sandbox = "none"), so it can reach the network'
    if network:
        return "its sandbox grants it the network"
    return None


def reads_only(nature: ServerNature, definition: Mapping[str, Any], original_name: str) -> bool:
    """Whether a tool of a server of ``nature`` counts as read-only whatever the server's trust."""
    if original_name in nature.reads:
        return True
    return nature.believes_read_claims and claims_read_only({**definition, "name": original_name})
