"""SandboxConfig validation: readable errors that name the key and the fix."""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel, ValidationError

from bastion.sandbox import SandboxConfig
from bastion.sandbox.config import format_bytes


class ServerSection(BaseModel):
    """How a gateway configuration would embed the sandbox section."""

    sandbox: SandboxConfig = SandboxConfig()


def error_text(**values) -> str:
    with pytest.raises(ValidationError) as raised:
        SandboxConfig(**values)
    return str(raised.value)


def test_sandboxed_by_default():
    config = ServerSection().sandbox
    assert config.sandboxed and config.profile == "default"
    assert config.limits.memory == 512 * 1024 * 1024 and config.limits.pids == 128 and config.limits.cpu == 1.0


def test_profile_name_shorthand():
    assert ServerSection.model_validate({"sandbox": "none"}).sandbox.sandboxed is False
    assert ServerSection.model_validate({"sandbox": "strict"}).sandbox.limits.pids == 32


def test_full_section():
    section = ServerSection.model_validate({"sandbox": {
        "read_only": ["~/docs"], "writable": ["/tmp/out"], "network": ["api.github.com:443", "*.npmjs.org:443"],
        "env": ["GITHUB_TOKEN"], "memory": "256MiB", "cpu": 0.5, "pids": 64,
    }})
    config = section.sandbox
    assert config.read_only == (os.path.expanduser("~/docs"),)
    assert config.limits.memory == 256 * 1024 * 1024 and config.limits.cpu == 0.5 and config.limits.pids == 64
    assert [rule.host for rule in config.allow_rules] == ["api.github.com", "npmjs.org"]


def test_explicit_limits_override_the_profile():
    config = SandboxConfig(profile="strict", memory="1GiB")
    assert config.limits.memory == 1024**3 and config.limits.pids == 32


@pytest.mark.parametrize("values, key, fix", [
    ({"profile": "docker"}, "profile", "use one of default, none, strict"),
    ({"read_only": ["relative/path"]}, "read_only", "write it as /full/path"),
    ({"writable": ["/"]}, "writable", "name the directories"),
    ({"network": ["example.com"]}, "network", "host:port"),
    ({"network": ["example.com:99999"]}, "network", "port from 1 to 65535"),
    ({"env": ["NOT-A-NAME"]}, "env", "not an environment variable name"),
    ({"memory": "1MiB"}, "memory", "at least '16MiB'"),
    ({"memory": "lots"}, "memory", "write it like '256MiB'"),
    ({"cpu": 0}, "cpu", "greater than 0"),
    ({"pids": 2}, "pids", "greater than or equal to 8"),
    ({"mem": "1GiB"}, "mem", "Extra inputs are not permitted"),
])
def test_errors_name_the_key_and_the_fix(values, key, fix):
    text = error_text(**values)
    assert key in text and fix in text


def test_none_with_grants_is_refused():
    text = error_text(profile="none", network=["api.github.com:443"])
    assert "profile 'none'" in text and "network" in text


@pytest.mark.parametrize("size, text", [(256 * 1024**2, "256 MiB"), (1024**3, "1 GiB"), (1536 * 1024**2, "1.5 GiB"),
                                        (4096, "4 KiB"), (100, "100 B")])
def test_format_bytes(size, text):
    assert format_bytes(size) == text
