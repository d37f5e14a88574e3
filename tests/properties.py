"""Hypothesis settings and strategies shared by the protocol-core tests."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# No example database: runs leave nothing behind in the checkout, and every run explores afresh.
PROPERTY = settings(database=None, deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])

# Integers orjson reads back as integers (it turns anything wider into a float).
JSON_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)
# Text orjson can encode: no lone surrogates.
JSON_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)

JSON_SCALARS = st.none() | st.booleans() | JSON_INTS | st.floats(allow_nan=False, allow_infinity=False) | JSON_TEXT
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(JSON_TEXT, children, max_size=4),
    max_leaves=20,
)
JSON_OBJECTS = st.dictionaries(JSON_TEXT, JSON_VALUES, max_size=5)

REQUEST_IDS = JSON_INTS | JSON_TEXT
