"""Tracing off is no tracing at all: the gateway ``build_gateway`` makes without a ``[tracing]`` table (and without
JSON logs) compiles every route with no step of observing, and its router calls servers with no layer around it.
With tracing on, what may stay the client's bytes (params, results) is what it is with tracing off."""

from __future__ import annotations

import asyncio
import json

import pytest

from bastion.compose import build_gateway
from bastion.config import load_config
from bastion.model import REQUEST, TO_CLIENT, TO_SERVER

ROUTES = [(TO_SERVER, REQUEST, method) for method in ("tools/call", "tools/list", "resources/read", "ping",
                                                      "initialize")] + [(TO_CLIENT, REQUEST, "sampling/createMessage")]


def _gateway(tmp_path, **settings):
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"echo": {"command": "true"}}, **settings}))
    return build_gateway(load_config(config), log_context=settings.pop("log_context", False))


@pytest.mark.parametrize("settings", [{}, {"policy": "off", "guardrails": "off"}])
def test_without_tracing_every_route_is_compiled_as_if_it_did_not_exist(tmp_path, settings):
    gateway = _gateway(tmp_path, **settings)
    try:
        assert gateway.observer is None
        for route in ROUTES:
            compiled = gateway.chain.route(*route)
            assert compiled.handle is compiled.entry_at[0]  # no step before the first interceptor's
        assert "_forward" not in vars(gateway.router)  # the router's own method, no layer around it
    finally:
        asyncio.run(gateway.close())


@pytest.mark.parametrize("settings", [{}, {"policy": "off", "guardrails": "off"}])
def test_tracing_on_keeps_what_stays_the_clients_bytes(tmp_path, settings):
    off, on = _gateway(tmp_path, **settings), _gateway(tmp_path, tracing={}, **settings)
    try:
        assert on.observer is not None
        for route in ROUTES:
            before, after = off.chain.route(*route), on.chain.route(*route)
            assert (before.raw_params, before.raw_results) == (after.raw_params, after.raw_results)
        assert on.takes_raw_params == off.takes_raw_params
        traced = on.chain.route(TO_SERVER, REQUEST, "tools/call")
        assert traced.handle is not traced.entry_at[0]
    finally:
        asyncio.run(off.close())
        asyncio.run(on.close())
