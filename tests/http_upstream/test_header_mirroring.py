"""The headers a 2026-07-28 request mirrors from its body, against the official SDK's own reading of them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mcp.shared.inbound import decode_header_value as sdk_decode_header_value
from mcp.shared.inbound import mcp_param_headers, x_mcp_header_map

from bastion.protocol.mirrored_headers import annotated_params, decode_header_value, encode_header_value
from bastion.transport.http_headers import param_headers

SCHEMA = {"type": "object", "properties": {
    "region": {"type": "string", "x-mcp-header": "Region"},
    "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"},
    "plain": {"type": "string"},
    "target": {"type": "object", "properties": {"zone": {"type": "integer", "x-mcp-header": "Zone"}}},
}}


def test_annotated_properties_are_found_at_their_path_as_the_sdk_finds_them():
    assert annotated_params(SCHEMA) == x_mcp_header_map(SCHEMA) == {
        ("region",): "Region", ("dry",): "Dry-Run", ("target", "zone"): "Zone"}
    assert annotated_params({"type": "object"}) == {} and annotated_params(None) == {}


def test_arguments_are_rendered_as_the_sdk_renders_them():
    for arguments in ({"region": "eu", "dry": True, "target": {"zone": 3}}, {"region": "Zürich", "dry": False},
                      {"plain": "x"}, {"region": None, "target": "not an object"}):
        assert param_headers(annotated_params(SCHEMA), arguments) == mcp_param_headers(x_mcp_header_map(SCHEMA),
                                                                                      arguments)


@given(st.text())
def test_any_header_value_survives_the_round_trip(value):
    encoded = encode_header_value(value)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert sdk_decode_header_value(encoded) == value
    assert decode_header_value(encoded) == value  # as Bastion's own frontend reads it
