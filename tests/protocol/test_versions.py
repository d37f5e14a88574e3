"""Version registry, legacy negotiation, era detection and the modern per-request envelope."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.protocol.jsonrpc import (
    INVALID_PARAMS,
    MISSING_CLIENT_CAPABILITY,
    UNSUPPORTED_PROTOCOL_VERSION,
    Request,
    parse_frame,
)
from bastion.protocol.versions import (
    DISCOVER,
    LATEST_LEGACY,
    LATEST_MODERN,
    LEGACY_VERSIONS,
    META_CLIENT_CAPABILITIES,
    META_CLIENT_INFO,
    META_LOG_LEVEL,
    META_PROTOCOL_VERSION,
    MODERN_VERSIONS,
    Envelope,
    is_complete,
    is_modern,
    is_modern_first_message,
    missing_capability,
    modern_meta,
    negotiate_legacy,
    read_envelope,
)

from tests.properties import JSON_OBJECTS, JSON_VALUES, PROPERTY

ALL_KNOWN = LEGACY_VERSIONS + MODERN_VERSIONS


def test_registry_lists_both_eras_in_order() -> None:
    assert LEGACY_VERSIONS == ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
    assert MODERN_VERSIONS == ("2026-07-28",)
    assert LATEST_LEGACY == "2025-11-25"
    assert LATEST_MODERN == "2026-07-28"
    assert list(ALL_KNOWN) == sorted(ALL_KNOWN), "dated versions sort chronologically"
    assert not set(LEGACY_VERSIONS) & set(MODERN_VERSIONS)


def test_meta_keys_use_the_reserved_prefix() -> None:
    assert META_PROTOCOL_VERSION == "io.modelcontextprotocol/protocolVersion"
    assert META_CLIENT_CAPABILITIES == "io.modelcontextprotocol/clientCapabilities"
    assert META_CLIENT_INFO == "io.modelcontextprotocol/clientInfo"
    assert META_LOG_LEVEL == "io.modelcontextprotocol/logLevel"
    assert DISCOVER == "server/discover"


# ----------------------------------------------------------------------------------- legacy negotiation
@pytest.mark.parametrize("version", LEGACY_VERSIONS)
def test_supported_legacy_version_is_echoed(version: str) -> None:
    assert negotiate_legacy(version) == version


@pytest.mark.parametrize(
    "requested",
    ["2026-07-28", "2099-01-01", "2024-10-07", "", "2025-06-18 ", "2025-6-18", None, 20250618, ["2025-06-18"], {"v": 1}],
)
def test_unsupported_legacy_request_gets_our_latest(requested: object) -> None:
    assert negotiate_legacy(requested) == LATEST_LEGACY


@PROPERTY
@given(JSON_VALUES | st.sampled_from(ALL_KNOWN))
def test_negotiation_always_answers_a_legacy_version(requested: object) -> None:
    answer = negotiate_legacy(requested)
    assert answer in LEGACY_VERSIONS
    assert (answer == requested) == (requested in LEGACY_VERSIONS)


@pytest.mark.parametrize(
    ("version", "modern"),
    [("2026-07-28", True), ("2025-11-25", False), ("2024-11-05", False), ("2026-07-29", False), (None, False),
     (20260728, False), (["2026-07-28"], False)],
)
def test_is_modern(version: object, modern: bool) -> None:
    assert is_modern(version) is modern


# ----------------------------------------------------------------------------------------- era detection
ERA_CASES = [
    ("server/discover without params", DISCOVER, None, True),
    ("server/discover with empty params", DISCOVER, {}, True),
    ("tools/list naming the modern version", "tools/list", {"_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}, True),
    ("tools/call naming an unsupported version", "tools/call", {"_meta": {META_PROTOCOL_VERSION: "2025-11-25"}}, True),
    ("request naming a null version", "tools/list", {"_meta": {META_PROTOCOL_VERSION: None}}, True),
    ("initialize", "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}}, False),
    ("initialize naming 2026 in params, not _meta", "initialize", {"protocolVersion": "2026-07-28"}, False),
    ("ping without params", "ping", None, False),
    ("_meta without a version", "tools/list", {"_meta": {"progressToken": 1}}, False),
    ("_meta that is not an object", "tools/list", {"_meta": [META_PROTOCOL_VERSION]}, False),
    ("version at the top of params", "tools/list", {META_PROTOCOL_VERSION: "2026-07-28"}, False),
]


@pytest.mark.parametrize(
    ("method", "params", "modern"), [(m, p, r) for _, m, p, r in ERA_CASES], ids=[c for c, _, _, _ in ERA_CASES]
)
def test_first_message_decides_the_era(method: str, params: dict | None, modern: bool) -> None:
    assert is_modern_first_message(method, params) is modern


def test_era_detection_works_on_parsed_frames() -> None:
    modern = parse_frame(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":'
        b'{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
    )
    legacy = parse_frame(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}')
    assert isinstance(modern, Request) and isinstance(legacy, Request)
    assert is_modern_first_message(modern.method, modern.params)
    assert not is_modern_first_message(legacy.method, legacy.params)


@PROPERTY
@given(st.text(max_size=20), st.none() | JSON_OBJECTS | st.fixed_dictionaries({"_meta": JSON_OBJECTS}))
def test_era_detection_never_raises_and_follows_the_rule(method: str, params: dict | None) -> None:
    meta = (params or {}).get("_meta")
    expected = method == DISCOVER or (isinstance(meta, dict) and META_PROTOCOL_VERSION in meta)
    assert is_modern_first_message(method, params) is expected


# -------------------------------------------------------------------------------------------- envelope
def envelope_params(**meta: object) -> dict:
    return {"_meta": dict(meta), "name": "x"}


def full_meta(**overrides: object) -> dict:
    meta = {
        META_PROTOCOL_VERSION: "2026-07-28",
        META_CLIENT_CAPABILITIES: {"elicitation": {}},
        META_CLIENT_INFO: {"name": "c", "version": "1"},
        META_LOG_LEVEL: "debug",
    }
    meta.update(overrides)
    return {"_meta": meta}


def test_complete_envelope_is_read() -> None:
    envelope = read_envelope(full_meta())
    assert envelope == Envelope("2026-07-28", {"elicitation": {}}, {"name": "c", "version": "1"}, "debug")


def test_optional_envelope_parts_may_be_absent() -> None:
    envelope = read_envelope({"_meta": {META_PROTOCOL_VERSION: "2026-07-28", META_CLIENT_CAPABILITIES: {}}})
    assert envelope == Envelope("2026-07-28", {}, None, None)


@pytest.mark.parametrize(
    ("overrides", "client_info", "log_level"),
    [({META_CLIENT_INFO: "c"}, None, "debug"), ({META_CLIENT_INFO: ["c"]}, None, "debug"),
     ({META_LOG_LEVEL: 7}, {"name": "c", "version": "1"}, None), ({META_LOG_LEVEL: None}, {"name": "c", "version": "1"}, None)],
)
def test_malformed_optional_parts_are_dropped_not_fatal(overrides: dict, client_info: object, log_level: object) -> None:
    envelope = read_envelope(full_meta(**overrides))
    assert isinstance(envelope, Envelope)
    assert envelope.client_info == client_info and envelope.log_level == log_level


MISSING_VERSION = [
    ("no params", None),
    ("no _meta", {"name": "x"}),
    ("_meta not an object", {"_meta": "2026-07-28"}),
    ("_meta without the version", {"_meta": {META_CLIENT_CAPABILITIES: {}}}),
    ("version null", {"_meta": {META_PROTOCOL_VERSION: None, META_CLIENT_CAPABILITIES: {}}}),
]


@pytest.mark.parametrize("params", [p for _, p in MISSING_VERSION], ids=[c for c, _ in MISSING_VERSION])
def test_missing_version_is_invalid_params_naming_the_key(params: dict | None) -> None:
    answer = read_envelope(params)
    assert isinstance(answer, dict)
    assert answer["code"] == INVALID_PARAMS
    assert META_PROTOCOL_VERSION in answer["message"]


@pytest.mark.parametrize("version", [*LEGACY_VERSIONS, "2026-07-29", "2099-01-01", "", 20260728, ["2026-07-28"], True])
def test_unsupported_version_is_32022_with_supported_and_requested(version: object) -> None:
    answer = read_envelope({"_meta": {META_PROTOCOL_VERSION: version, META_CLIENT_CAPABILITIES: {}}})
    assert isinstance(answer, dict)
    assert answer["code"] == UNSUPPORTED_PROTOCOL_VERSION == -32022
    assert answer["data"] == {"supported": list(MODERN_VERSIONS), "requested": version}


@pytest.mark.parametrize("capabilities", [None, [], "all", 1, True])
def test_capabilities_must_be_an_object(capabilities: object) -> None:
    meta: dict = {META_PROTOCOL_VERSION: "2026-07-28"}
    if capabilities is not None:
        meta[META_CLIENT_CAPABILITIES] = capabilities
    answer = read_envelope({"_meta": meta})
    assert isinstance(answer, dict)
    assert answer["code"] == INVALID_PARAMS
    assert META_CLIENT_CAPABILITIES in answer["message"] and "object" in answer["message"]


def test_version_is_checked_before_capabilities() -> None:
    answer = read_envelope({"_meta": {META_PROTOCOL_VERSION: "2025-06-18"}})
    assert isinstance(answer, dict) and answer["code"] == UNSUPPORTED_PROTOCOL_VERSION


@PROPERTY
@given(st.none() | JSON_OBJECTS | st.fixed_dictionaries({"_meta": JSON_OBJECTS}, optional={"x": JSON_VALUES}),
       st.sampled_from([None, *ALL_KNOWN]), st.sampled_from([None, {}, {"sampling": {}}, [], "x"]))
def test_read_envelope_never_raises(params: dict | None, version: object, capabilities: object) -> None:
    if isinstance(params, dict) and isinstance(params.get("_meta"), dict):
        if version is not None:
            params["_meta"][META_PROTOCOL_VERSION] = version
        if capabilities is not None:
            params["_meta"][META_CLIENT_CAPABILITIES] = capabilities
    answer = read_envelope(params)
    meta = (params or {}).get("_meta") if isinstance((params or {}).get("_meta"), dict) else {}
    good = is_modern(meta.get(META_PROTOCOL_VERSION)) and isinstance(meta.get(META_CLIENT_CAPABILITIES), dict)
    assert isinstance(answer, Envelope) is good
    if not good:
        assert answer["code"] in (INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION)


def test_missing_capability_error() -> None:
    answer = missing_capability("elicitation")
    assert answer["code"] == MISSING_CLIENT_CAPABILITY == -32021
    assert "elicitation" in answer["message"]
    assert answer["data"] == {"requiredCapabilities": {"elicitation": {}}}


def test_modern_meta_round_trips_through_read_envelope() -> None:
    capabilities = {"sampling": {}}
    info = {"name": "bastion", "version": "0"}
    meta = modern_meta(capabilities, info, "info")
    assert meta[META_PROTOCOL_VERSION] == LATEST_MODERN
    assert read_envelope({"_meta": meta}) == Envelope(LATEST_MODERN, capabilities, info, "info")


def test_modern_meta_omits_an_absent_log_level_and_copies_its_inputs() -> None:
    capabilities = {"sampling": {}}
    info = {"name": "bastion"}
    meta = modern_meta(capabilities, info)
    assert META_LOG_LEVEL not in meta
    capabilities["roots"] = {}
    info["name"] = "changed"
    assert meta[META_CLIENT_CAPABILITIES] == {"sampling": {}}
    assert meta[META_CLIENT_INFO] == {"name": "bastion"}


@pytest.mark.parametrize(
    ("result", "complete"),
    [({}, True), ({"resultType": "complete"}, True), ({"resultType": "input_required", "inputRequests": {}}, False),
     ({"content": [], "isError": True}, True)],
)
def test_result_completeness(result: dict, complete: bool) -> None:
    assert is_complete(result) is complete
