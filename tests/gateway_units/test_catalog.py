"""The federated catalog: stable tool order, collisions, resource owners (RFC 6570 templates), cursors."""

from __future__ import annotations

import base64
import copy
import hashlib
import logging

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.gateway.catalog import (
    KINDS,
    BadCursor,
    Catalog,
    ServerFacts,
    decode_cursor,
    encode_cursor,
    paginate,
)
from bastion.gateway.naming import Named
from bastion.model import ToolEntry

from tests.properties import JSON_VALUES, PROPERTY

SERVERS = [ServerFacts("git", "git", "trusted"), ServerFacts("fs", "fs", "untrusted"), ServerFacts("web", "web", "untrusted")]


def tool(name: str, **extra: object) -> dict:
    return {"name": name, "inputSchema": {"type": "object"}, **extra}


TOOLS = {
    "git": [tool("status", description="show status"), tool("commit")],
    "fs": [tool("read"), tool("write", annotations={"destructiveHint": True})],
    "web": [tool("fetch")],
}


def catalog_with(tools: dict[str, list[dict]], servers: list[ServerFacts] = SERVERS) -> Catalog:
    catalog = Catalog(servers)
    for server, items in tools.items():
        catalog.update(server, "tools", items)
    return catalog


# ----------------------------------------------------------------------------------------------- tools
def test_tools_are_listed_under_exposed_names_in_sorted_order() -> None:
    catalog = catalog_with(TOOLS)
    names = [t["name"] for t in catalog.listing("tools")]
    assert names == ["fs__read", "fs__write", "git__commit", "git__status", "web__fetch"]


def test_definitions_keep_everything_but_the_name() -> None:
    catalog = catalog_with(TOOLS)
    listed = {t["name"]: t for t in catalog.listing("tools")}
    assert listed["git__status"] == {"name": "git__status", "inputSchema": {"type": "object"}, "description": "show status"}
    assert listed["fs__write"]["annotations"] == {"destructiveHint": True}


def test_upstream_definitions_are_not_modified() -> None:
    tools = copy.deepcopy(TOOLS)
    catalog_with(tools)
    assert tools == TOOLS


def test_tool_lists_are_the_same_bytes_whatever_key_order_servers_write() -> None:
    """For prompt caches: keys sorted at every depth, whatever the server (or a restart of it) wrote."""
    written = {"name": "search", "inputSchema": {"type": "object", "properties": {
        "query": {"type": "string", "description": "Words"}, "limit": {"type": "integer", "minimum": 1}}},
        "description": "Search the web", "annotations": {"readOnlyHint": True, "title": "Search"}}

    def reordered(value):
        return {k: reordered(v) for k, v in reversed(list(value.items()))} if isinstance(value, dict) else value

    first, second = catalog_with({"web": [written]}), catalog_with({"web": [reordered(written)]})
    assert list(reordered(written)) != list(written)
    assert orjson.dumps(first.listing("tools")) == orjson.dumps(second.listing("tools"))
    assert orjson.dumps(first.listing("tools")) == orjson.dumps(first.listing("tools"), option=orjson.OPT_SORT_KEYS)
    assert first.listing("tools")[0] == {**written, "name": "web__search"}, "nothing but the order changes"


def test_the_tool_sequence_is_new_after_each_change_and_the_same_object_until_then() -> None:
    """Search mode tells that nothing changed by identity: it is asked on every request."""
    catalog = catalog_with(TOOLS)
    entries, listed = catalog.tools(), catalog.listing("tools")
    assert catalog.tools() is entries and catalog.listing("tools") is listed
    assert not catalog.update("web", "tools", [tool("fetch")])  # the same list again changes nothing
    assert catalog.tools() is entries
    assert catalog.update("web", "tools", [tool("fetch"), tool("post")])
    assert catalog.tools() is not entries and "web__post" in [t["name"] for t in catalog.listing("tools")]
    assert [e.exposed_name for e in entries] == ["fs__read", "fs__write", "git__commit", "git__status", "web__fetch"]


def test_tool_lookup_maps_back_to_server_and_original_name() -> None:
    catalog = catalog_with(TOOLS)
    entry = catalog.tool("git__status")
    assert entry == ToolEntry("git__status", "git", "status", {**TOOLS["git"][0], "name": "git__status"}, "trusted")
    assert catalog.tool("fs__write").server_trust == "untrusted"  # type: ignore[union-attr]
    assert catalog.tool("status") is None
    assert catalog.tool("git__missing") is None
    assert [e.exposed_name for e in catalog.tools()] == [t["name"] for t in catalog.listing("tools")]


@PROPERTY
@given(st.permutations([(s, k) for s in ("git", "fs", "web") for k in ("tools", "prompts")]))
def test_order_servers_answer_in_changes_nothing(order: list[tuple[str, str]]) -> None:
    def build(sequence: list[tuple[str, str]]) -> Catalog:
        catalog = Catalog(SERVERS)
        for server, kind in sequence:
            items = TOOLS[server] if kind == "tools" else [{"name": p} for p in ("summarize", "review")]
            catalog.update(server, kind, items)
        return catalog

    reference = build(sorted(order))
    shuffled = build(order)
    assert shuffled.listing("tools") == reference.listing("tools")
    assert shuffled.listing("prompts") == reference.listing("prompts")
    assert [t["name"] for t in shuffled.listing("tools")] == sorted(t["name"] for t in shuffled.listing("tools"))


def test_collision_order_does_not_depend_on_who_answers_first() -> None:
    servers = [ServerFacts("one", "shared", "untrusted"), ServerFacts("two", "shared", "untrusted")]
    first = catalog_with({"one": [tool("search")], "two": [tool("search")]}, servers)
    second = catalog_with({"two": [tool("search")], "one": [tool("search")]}, servers)
    assert first.listing("tools") == second.listing("tools")


def test_colliding_tools_are_both_reachable_and_the_collision_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    servers = [ServerFacts("one", "shared", "untrusted"), ServerFacts("two", "shared", "untrusted")]
    with caplog.at_level(logging.WARNING, logger="bastion.catalog"):
        catalog = catalog_with({"one": [tool("search")], "two": [tool("search")]}, servers)
    assert catalog.tool("shared__search") is None
    assert (catalog.tool("one__search").server, catalog.tool("two__search").server) == ("one", "two")  # type: ignore[union-attr]
    assert any("shared__search" in r.getMessage() and "one" in r.getMessage() and "two" in r.getMessage() for r in caplog.records)


def test_long_tool_names_are_shortened_and_still_route_to_their_original() -> None:
    originals = ["analyse_" + "x" * 70 + "_daily", "analyse_" + "x" * 70 + "_weekly"]
    catalog = catalog_with({"web": [tool(o) for o in originals]})
    listed = [t["name"] for t in catalog.listing("tools")]
    assert len(listed) == 2 and all(len(n) <= 64 for n in listed)
    assert sorted(catalog.tool(n).original_name for n in listed) == sorted(originals)  # type: ignore[union-attr]


def test_a_server_offering_the_fallback_name_cannot_break_the_catalog() -> None:
    servers = [ServerFacts(n, p, "untrusted") for n, p in (("alpha", "p"), ("beta", "p"), ("other", "alpha"), ("mallory", "alpha"))]
    decoy = "t_" + hashlib.sha256(b"alpha/t").hexdigest()[:8]
    catalog = catalog_with({"alpha": [tool("t")], "beta": [tool("t")], "other": [tool("t")], "mallory": [tool(decoy)]}, servers)
    assert len(catalog.listing("tools")) == 4


# ------------------------------------------------------------------------------------------- updates
def test_update_reports_change_and_bumps_the_version_only_on_change() -> None:
    catalog = Catalog(SERVERS)
    assert catalog.version == 0
    assert catalog.update("git", "tools", [tool("status")]) is True
    assert catalog.version == 1
    assert catalog.update("git", "tools", [tool("status")]) is False
    assert catalog.version == 1
    assert catalog.update("git", "tools", [tool("status", description="new")]) is True
    assert catalog.version == 2
    assert catalog.tool("git__status").definition["description"] == "new"  # type: ignore[union-attr]


def test_a_server_dropping_a_tool_removes_it() -> None:
    catalog = catalog_with(TOOLS)
    catalog.update("fs", "tools", [tool("read")])
    assert catalog.tool("fs__write") is None
    assert "fs__write" not in [t["name"] for t in catalog.listing("tools")]


def test_server_items_are_kept_per_kind() -> None:
    catalog = catalog_with(TOOLS)
    assert catalog.server_items("fs", "tools") == TOOLS["fs"]
    for kind in KINDS[1:]:
        assert catalog.server_items("fs", kind) == []


# ---------------------------------------------------------------------------------------------- prompts
def test_prompts_are_prefixed_sorted_and_mapped_back() -> None:
    catalog = Catalog(SERVERS)
    catalog.update("web", "prompts", [{"name": "summarize", "description": "d"}])
    catalog.update("git", "prompts", [{"name": "review"}])
    assert catalog.listing("prompts") == [{"name": "git__review"}, {"name": "web__summarize", "description": "d"}]
    assert catalog.prompt("web__summarize") == Named("web__summarize", "web", "summarize")
    assert catalog.prompt("summarize") is None


# --------------------------------------------------------------------------------------------- resources
def resources_catalog() -> Catalog:
    catalog = Catalog(SERVERS)
    catalog.update("fs", "resources", [{"uri": "file:///etc/hosts", "name": "hosts"}, {"uri": 5, "name": "broken"}])
    catalog.update("web", "resources", [{"uri": "file:///etc/hosts", "name": "shadow"}, {"uri": "https://a.example/x", "name": "x"}])
    catalog.update("git", "resourceTemplates", [{"uriTemplate": "git://{repo}/commits/{sha}", "name": "commit"}])
    catalog.update("fs", "resourceTemplates", [{"uriTemplate": "file:///{+path}", "name": "file"}, {"uriTemplate": 3}])
    catalog.update("web", "resourceTemplates", [{"uriTemplate": "https://a.example/search{?q,lang}", "name": "search"},
                                                 {"uriTemplate": "file:///srv/{name}", "name": "late"}])
    return catalog


OWNERS = [
    ("file:///etc/hosts", "fs"),  # offered by fs and web: the server listed first in the configuration wins
    ("https://a.example/x", "web"),
    ("git://bastion/commits/abc123", "git"),
    ("git://org/repo/commits/abc", "git"),  # an expression may expand to text with slashes
    ("git:///commits/", "git"),  # or to nothing
    ("file:///home/u/notes.txt", "fs"),
    ("file:///srv/thing", "web"),  # web's template is more specific than fs's catch-all (equal trust)
    ("https://a.example/search", "web"),
    ("https://a.example/search?q=mcp&lang=en", "web"),
    ("git://bastion/trees/abc", None),
    ("gitXbastion/commits/abc", None),
    ("https://a.example/y", None),
    ("http://a.example/x", None),
    ("", None),
]


@pytest.mark.parametrize(("uri", "owner"), OWNERS, ids=[u or "empty" for u, _ in OWNERS])
def test_resource_owner(uri: str, owner: str | None) -> None:
    assert resources_catalog().resource_owner(uri) == owner


def test_template_literals_are_not_regular_expressions() -> None:
    catalog = Catalog(SERVERS)
    catalog.update("web", "resourceTemplates", [{"uriTemplate": "db://a.b/{table}(x)+", "name": "t"}])
    assert catalog.resource_owner("db://a.b/users(x)+") == "web"
    assert catalog.resource_owner("db://aXb/users(x)+") is None
    assert catalog.resource_owner("db://a.b/usersxx") is None


def test_resource_owner_first_in_configuration_wins_whatever_the_update_order() -> None:
    catalog = Catalog(SERVERS)
    catalog.update("web", "resources", [{"uri": "mem://shared"}])
    catalog.update("git", "resources", [{"uri": "mem://shared"}])
    assert catalog.resource_owner("mem://shared") == "git"


def test_a_catch_all_template_of_an_untrusted_server_captures_no_read_of_a_trusted_one(caplog) -> None:
    """An untrusted server's ``notes://{+rest}``, listed first, once answered every read meant for the trusted
    server's ``notes://{id}`` and became its owner for the confused-deputy check."""
    catalog = Catalog([ServerFacts("grab", "grab", "untrusted"), ServerFacts("notes", "notes", "trusted")])
    catalog.update("grab", "resourceTemplates", [{"uriTemplate": "notes://{+rest}", "name": "all"},
                                                 {"uriTemplate": "notes://private/{id}", "name": "narrow"}])
    with caplog.at_level("WARNING", logger="bastion.catalog"):
        catalog.update("notes", "resourceTemplates", [{"uriTemplate": "notes://{id}", "name": "note"}])
    assert catalog.resource_owner("notes://7") == "notes"
    # More specific, but of lower trust: it cannot claim what the trusted template matches.
    assert catalog.resource_owner("notes://private/7") == "notes"
    server, kind, definition = catalog.resource_definition("notes://private/7")
    assert (server, kind, definition["name"]) == ("notes", "resourceTemplates", "note")
    assert "overlap" in caplog.text and "read from notes" in caplog.text
    # A listed resource of the untrusted server under a trusted template's URI is not read from it either.
    catalog.update("grab", "resources", [{"uri": "notes://8", "name": "decoy"}])
    assert catalog.resource_owner("notes://8") == "notes"
    # And a URI only the untrusted server offers is still its own.
    catalog.update("grab", "resources", [{"uri": "grab://x", "name": "own"}])
    assert catalog.resource_owner("grab://x") == "grab"


def test_the_most_specific_template_answers_among_servers_of_equal_trust() -> None:
    catalog = Catalog([ServerFacts("wide", "wide", "untrusted"), ServerFacts("narrow", "narrow", "untrusted")])
    catalog.update("wide", "resourceTemplates", [{"uriTemplate": "db://{+rest}", "name": "any"}])
    catalog.update("narrow", "resourceTemplates", [{"uriTemplate": "db://users/{id}", "name": "user"}])
    assert catalog.resource_owner("db://users/3") == "narrow"
    assert catalog.resource_owner("db://orders/3") == "wide"
    # Equally specific: the first in the configuration.
    catalog.update("narrow", "resourceTemplates", [{"uriTemplate": "db://{+path}", "name": "all"}])
    assert catalog.resource_owner("db://users/3") == "wide"


def test_a_resource_offered_by_two_servers_is_read_from_the_more_trusted() -> None:
    catalog = Catalog([ServerFacts("fs", "fs", "untrusted"), ServerFacts("git", "git", "trusted")])
    catalog.update("fs", "resources", [{"uri": "mem://shared", "name": "fs copy"}])
    catalog.update("git", "resources", [{"uri": "mem://shared", "name": "git copy"}])
    assert catalog.resource_owner("mem://shared") == "git"  # git is trusted, fs is not, though fs is listed first
    assert [r["name"] for r in catalog.listing("resources")] == ["git copy"]


def test_template_owner_prefers_the_exact_template() -> None:
    catalog = resources_catalog()
    assert catalog.template_owner("file:///srv/{name}") == "web"
    assert catalog.template_owner("git://{repo}/commits/{sha}") == "git"
    assert catalog.template_owner("file:///etc/hosts") == "fs"
    assert catalog.template_owner("nothing://{x}") is None


def test_resources_and_templates_are_listed_in_configuration_order_each_uri_once() -> None:
    catalog = resources_catalog()
    # "shadow" is web's copy of fs's URI: listed once, as it is read, from fs.
    assert [r["name"] for r in catalog.listing("resources")] == ["hosts", "x"]
    assert [t.get("name") for t in catalog.listing("resourceTemplates")] == ["commit", "file", "search", "late"]


@pytest.mark.parametrize(
    ("kind", "bad", "why"),
    [
        ("tools", {"name": 5, "inputSchema": {"type": "object"}}, "'name' is not a non-empty string"),
        ("tools", {"name": None, "inputSchema": {"type": "object"}}, "'name' is missing"),
        ("tools", {"name": "", "inputSchema": {"type": "object"}}, "'name' is not a non-empty string"),
        ("tools", {"description": "no name", "inputSchema": {"type": "object"}}, "'name' is missing"),
        ("tools", {"name": "no_schema"}, "'inputSchema' is not a JSON object"),
        ("tools", {"name": "list_schema", "inputSchema": []}, "'inputSchema' is not a JSON object"),
        ("prompts", {"name": ["x"]}, "'name' is not a non-empty string"),
        ("resources", {"uri": 5, "name": "five"}, "'uri' is not a non-empty string"),
        ("resourceTemplates", {"name": "t"}, "'uriTemplate' is missing"),
    ],
)
def test_an_item_a_client_could_not_use_is_left_out_alone_and_named(
    kind: str, bad: dict, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"tools": {"name": "ok", "inputSchema": {"type": "object"}}, "prompts": {"name": "ok"},
            "resources": {"uri": "mem://ok", "name": "ok"}, "resourceTemplates": {"uriTemplate": "mem://{x}", "name": "ok"}}[kind]
    catalog = Catalog(SERVERS)
    assert catalog.update("fs", kind, [bad, good])
    assert catalog.listing(kind) == [dict(good, name="fs__ok") if kind in ("tools", "prompts") else good]
    assert [r.getMessage() for r in caplog.records if "left out" in r.getMessage()] == [
        f"server fs: one of its {kind} is left out, as its {why}: {orjson.dumps(bad).decode()}"]
    # The catalog keeps working for every server afterwards.
    other = {key: value.replace("ok", "other") if isinstance(value, str) else value for key, value in good.items()}
    assert catalog.update("git", kind, [other])
    assert len(catalog.listing(kind)) == 2


# -------------------------------------------------------------------------------------------- pagination
ITEMS = [f"item{i}" for i in range(7)]


def test_pages_follow_opaque_cursors_to_the_end() -> None:
    page, cursor = paginate(ITEMS, None, 3)
    assert page == ITEMS[:3] and isinstance(cursor, str)
    with pytest.raises(BadCursor):
        paginate(ITEMS, "3", 3)  # a bare offset is not a cursor
    page, cursor = paginate(ITEMS, cursor, 3)
    assert page == ITEMS[3:6] and cursor is not None
    page, cursor = paginate(ITEMS, cursor, 3)
    assert page == ITEMS[6:] and cursor is None


def test_exact_multiple_of_the_page_size_ends_without_a_cursor() -> None:
    page, cursor = paginate(ITEMS[:6], None, 3)
    page, cursor = paginate(ITEMS[:6], cursor, 3)
    assert page == ITEMS[3:6] and cursor is None


@pytest.mark.parametrize("page_size", [0, -1])
def test_page_size_zero_means_everything(page_size: int) -> None:
    assert paginate(ITEMS, None, page_size) == (ITEMS, None)
    assert paginate(ITEMS, encode_cursor(5), page_size) == (ITEMS[5:], None)


def test_cursor_past_the_end_gives_an_empty_last_page() -> None:
    assert paginate(ITEMS, encode_cursor(100), 3) == ([], None)


def test_empty_list() -> None:
    assert paginate([], None, 3) == ([], None)


BAD_CURSORS = [
    ("empty", ""),
    ("not base64", "!!!!"),
    ("one character", "a"),
    ("base64 of garbage", "Zm9vYmFy"),
    ("base64 of a list", "WzFd"),
    ("base64 of an object without o", "eyJwIjoxfQ"),
    ("negative offset", "eyJvIjotMX0"),
    ("string offset", "eyJvIjoiMSJ9"),
    ("boolean offset", "eyJvIjp0cnVlfQ"),
    ("float offset", "eyJvIjoxLjV9"),
    ("null offset", "eyJvIjpudWxsfQ"),
    ("non-ASCII", "\u00e9\u00e9\u00e9\u00e9"),
    ("integer", 3),
    ("list", ["eyJvIjoxfQ"]),
    ("object", {"o": 1}),
    ("boolean", True),
]


@pytest.mark.parametrize("cursor", [c for _, c in BAD_CURSORS], ids=[n for n, _ in BAD_CURSORS])
def test_bad_cursor_raises_bad_cursor(cursor: object) -> None:
    with pytest.raises(BadCursor):
        paginate(ITEMS, cursor, 3)


def test_bad_cursor_message_names_the_cursor() -> None:
    with pytest.raises(BadCursor, match="invalid cursor 'nope'"):
        decode_cursor("nope")


@PROPERTY
@given(st.integers(min_value=0, max_value=2**63))
def test_cursor_round_trips(offset: int) -> None:
    cursor = encode_cursor(offset)
    assert "=" not in cursor and cursor.isascii()
    assert decode_cursor(cursor) == offset


@PROPERTY
@given(
    st.text(max_size=40)
    | st.binary(max_size=30).map(lambda b: base64.urlsafe_b64encode(b).decode())
    | (JSON_VALUES | st.dictionaries(st.just("o"), JSON_VALUES)).map(
        lambda v: base64.urlsafe_b64encode(orjson.dumps(v)).decode().rstrip("="))
)
def test_decode_cursor_only_ever_raises_bad_cursor(cursor: str) -> None:
    try:
        offset = decode_cursor(cursor)
    except BadCursor:
        return
    assert isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0


@PROPERTY
@given(st.lists(st.integers(), max_size=40), st.integers(min_value=1, max_value=12))
def test_walking_the_cursors_yields_every_item_once_in_order(items: list[int], page_size: int) -> None:
    seen: list[int] = []
    cursor = None
    for _ in range(len(items) + 2):
        page, cursor = paginate(items, cursor, page_size)
        assert len(page) <= page_size
        seen.extend(page)
        if cursor is None:
            break
    assert cursor is None
    assert seen == items


_ITEM_FIELDS = st.sampled_from(["name", "uri", "uriTemplate", "inputSchema", "description"])


@PROPERTY
@given(st.sampled_from(KINDS), st.lists(st.dictionaries(_ITEM_FIELDS | st.text(max_size=5), JSON_VALUES, max_size=4), max_size=6))
def test_whatever_a_server_lists_the_catalog_keeps_only_usable_items_and_never_raises(kind: str, items: list) -> None:
    catalog = Catalog(SERVERS)
    catalog.update("fs", kind, copy.deepcopy(items))
    catalog.update("web", kind, copy.deepcopy(items))
    key = {"tools": "name", "prompts": "name", "resources": "uri", "resourceTemplates": "uriTemplate"}[kind]
    for item in catalog.listing(kind):
        assert isinstance(item[key], str) and item[key]
        assert kind != "tools" or isinstance(item["inputSchema"], dict)


def test_a_reloaded_server_set_keeps_unchanged_servers_items_and_drops_the_others() -> None:
    catalog = Catalog(SERVERS)
    catalog.update("git", "tools", [{"name": "status", "inputSchema": {"type": "object"}}])
    catalog.update("fs", "tools", [{"name": "read", "inputSchema": {"type": "object"}}])
    catalog.update("web", "prompts", [{"name": "summarise"}])
    # fs removed, web restarted, git unchanged, a new server with nothing yet
    changed = catalog.set_servers([SERVERS[0], SERVERS[2], ServerFacts("mail", "mail", "untrusted")], {"web"})
    assert sorted(changed) == ["prompts", "tools"]  # what the clients are told
    assert [entry.exposed_name for entry in catalog.tools()] == ["git__status"]
    assert catalog.listing("prompts") == []
    assert catalog.update("mail", "tools", [{"name": "send", "inputSchema": {"type": "object"}}])
    assert catalog.tool("mail__send") is not None


def test_a_server_whose_trust_changed_starts_again_with_nothing() -> None:
    catalog = Catalog(SERVERS)
    catalog.update("git", "tools", [{"name": "status", "inputSchema": {"type": "object"}}])
    assert catalog.set_servers([ServerFacts("git", "git", "untrusted")]) == ["tools"]
    assert catalog.tools() == []
    assert catalog.set_servers([ServerFacts("git", "git", "untrusted")]) == []  # nothing more to tell
