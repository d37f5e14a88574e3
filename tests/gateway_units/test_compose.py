"""The composition root: build_gateway builds the policy, the search exposure and the tool index, and a Gateway
given a configuration that needs them but not the parts refuses to start without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bastion.compose import LazyCatalogIndex, build_gateway
from bastion.config import GatewayConfig
from bastion.gateway.core import Gateway
from bastion.policy.interceptors import PolicyRuntime
from bastion.search.exposure import CatalogIndex

ROOT = Path(__file__).resolve().parents[2]
SERVER = {"command": sys.executable, "args": ["-c", "pass"], "sandbox": "none"}


def config(**options) -> GatewayConfig:
    return GatewayConfig.model_validate({"servers": {"raw": SERVER}, **options})


async def test_a_configured_policy_is_built_and_runs_on_every_call() -> None:
    gateway = build_gateway(config())  # no policy key: the default policy, on
    try:
        assert isinstance(gateway.policy, PolicyRuntime)
        # The policy is in the chain and reads a call's arguments, so they reach it decoded.
        assert gateway.takes_raw_params is False
    finally:
        await gateway.close()


async def test_policy_off_builds_none_and_leaves_the_direct_route_open() -> None:
    gateway = build_gateway(config(policy="off"))
    try:
        assert gateway.policy is None
        assert gateway.takes_raw_params is True  # nothing in the chain reads a call's arguments
        assert isinstance(gateway.tool_index(), LazyCatalogIndex)
    finally:
        await gateway.close()


async def test_search_exposure_gets_an_index_over_the_gateways_own_catalog() -> None:
    gateway = build_gateway(config(policy="off", tools={"exposure": "search"}))
    try:
        assert isinstance(gateway.tool_index(), CatalogIndex)
        assert gateway.tool_index()._catalog is gateway.catalog
        # The exposure interceptor reads a call's name, and decodes the arguments of its own meta-tools only.
        assert gateway.takes_raw_params is True
    finally:
        await gateway.close()


@pytest.mark.parametrize("options, missing", [({}, "policy"), ({"policy": "off", "tools": {"exposure": "search"}},
                                                                "search exposure")])
def test_a_gateway_built_without_the_parts_its_configuration_needs_refuses(options, missing) -> None:
    with pytest.raises(ValueError) as refused:
        Gateway(config(**options))
    assert missing in str(refused.value) and "build_gateway" in str(refused.value)


def test_all_exposure_does_not_load_the_search_index() -> None:
    # The index brings numpy, bm25s and a model runtime: a gateway that lists every tool must not pay for them.
    probe = (
        "import sys\n"
        "from bastion.compose import build_gateway\n"
        "from bastion.config import GatewayConfig\n"
        f"build_gateway(GatewayConfig.model_validate({{'servers': {{'raw': {SERVER!r}}}, 'policy': 'off', "
        "'tools': {'exposure': 'all'}}))\n"
        "print(sorted(m for m in ('bastion.search.index', 'numpy', 'bm25s') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
