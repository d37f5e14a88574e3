"""Command-line conventions: --version, global -v/-q before or after any subcommand, `bastion tools --json`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bastion import __version__
from bastion.cli.conventions import split_global_flags
from bastion.cli.main import build_parser
from tests.support import BASTION, FIXTURES


def _environment(tmp_path: Path) -> dict[str, str]:
    """The test's own state and configuration; the caches (derived models, compiled rules) are the test run's."""
    env = dict(os.environ)
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return env


def _bastion(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASTION, *argv], capture_output=True, text=True, env=_environment(tmp_path),
                          stdin=subprocess.DEVNULL, timeout=300)


@pytest.fixture
def raw_config(tmp_path: Path) -> Path:
    server = {"command": sys.executable, "args": [str(FIXTURES / "raw_server.py"), "conventions"], "trust": "trusted"}
    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"raw": server}}))
    return config


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    children = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not children:
        yield path, parser
    for action in children:
        for name, child in action.choices.items():
            yield from _leaf_parsers(child, (*path, name))


def test_version_prints_the_package_version_on_stdout(tmp_path):
    done = _bastion(tmp_path, "--version")
    assert done.returncode == 0
    assert done.stdout == f"bastion {__version__}\n"
    assert done.stderr == ""


def test_every_subcommand_takes_the_global_flags_after_it():
    leaves = dict(_leaf_parsers(build_parser()))
    assert ("run",) in leaves and ("audit", "verify") in leaves and ("sandbox", "run") in leaves
    for path, parser in leaves.items():
        for option in ("-v", "--verbose", "-q", "--quiet"):
            assert option in parser._option_string_actions, f"bastion {' '.join(path)} lacks {option}"


@pytest.mark.parametrize("argv", [
    ["-v", "audit", "verify", "trail.jsonl"], ["audit", "verify", "trail.jsonl", "-v"],
    ["-q", "approvals"], ["approvals", "--quiet"], ["--verbose", "policy", "check", "--identity", "a", "--tool", "t"],
    ["policy", "check", "--identity", "a", "--tool", "t", "-v"],
])
def test_global_flags_parse_before_or_after_the_subcommand(argv):
    args = build_parser().parse_args(argv)
    assert getattr(args, "verbose", False) or getattr(args, "quiet", False)


def test_a_subcommands_own_flags_and_its_commands_arguments_are_left_alone():
    args = build_parser().parse_args(["sandbox", "run", "--quiet", "--", "echo", "-v", "-q"])
    assert args.quiet is True
    assert args.command == ["--", "echo", "-v", "-q"]
    assert not getattr(args, "verbose", False)
    kept, found = split_global_flags(["stats", "c.toml", "-v", "--json", "--", "-q"])
    assert kept == ["stats", "c.toml", "--json", "--", "-q"] and found == {"verbose": True}


def test_quiet_before_or_after_tools_silences_info_and_verbose_adds_debug(tmp_path, raw_config):
    normal = _bastion(tmp_path, "tools", str(raw_config))
    assert normal.returncode == 0, normal.stderr
    assert " INFO " in normal.stderr
    for argv in (["-q", "tools", str(raw_config)], ["tools", str(raw_config), "-q"]):
        quiet = _bastion(tmp_path, *argv)
        assert quiet.returncode == 0, quiet.stderr
        assert " INFO " not in quiet.stderr, argv
        assert "raw__echo" in quiet.stdout
    # A server that cannot start is logged at DEBUG too (the gateway's own view of it), with -v only.
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"servers": {"missing": {"command": str(tmp_path / "absent"), "startup_timeout": 30}}}))
    for argv in (["-v", "tools", str(missing)], ["tools", str(missing), "--verbose"]):
        verbose = _bastion(tmp_path, *argv)
        assert verbose.returncode == 1, verbose.stderr
        assert " DEBUG " in verbose.stderr, argv
    assert " DEBUG " not in _bastion(tmp_path, "tools", str(missing)).stderr


def test_tools_json_is_the_catalog_on_stdout(tmp_path, raw_config):
    for argv in (["tools", "--json", str(raw_config)], ["tools", str(raw_config), "--json", "-q"]):
        done = _bastion(tmp_path, *argv)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        names = {tool["name"]: tool for tool in report["tools"]}
        assert "raw__echo" in names, report
        echo = names["raw__echo"]
        assert echo["server"] == "raw" and echo["original_name"] == "echo"
        assert echo["definition"]["name"] == "raw__echo"
        assert echo["definition"]["inputSchema"]["properties"]["text"] == {"type": "string"}
        assert report["servers"]["raw"]["available"] is True


def test_tools_json_names_a_server_that_did_not_start_and_exits_1(tmp_path, raw_config):
    config = json.loads(raw_config.read_text())
    config["servers"]["missing"] = {"command": str(tmp_path / "no-such-server"), "startup_timeout": 30}
    raw_config.write_text(json.dumps(config))
    done = _bastion(tmp_path, "tools", str(raw_config), "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["servers"]["missing"]["available"] is False
    assert report["servers"]["raw"]["available"] is True
    assert {t["server"] for t in report["tools"]} == {"raw"}


@pytest.mark.parametrize("extra_tools", [0, 600], ids=["output-within-one-buffer", "output-of-many-buffers"])
def test_a_reader_that_closes_stdout_ends_bastion_quietly(tmp_path, raw_config, extra_tools):
    """`bastion tools | head -1`: when the reader has gone, bastion exits 141 (as for SIGPIPE) without a traceback."""
    config = json.loads(raw_config.read_text())
    config["servers"]["raw"]["env"] = {"RAW_SERVER_EXTRA_TOOLS": json.dumps(
        [{"name": f"extra{i}", "description": "An extra tool. " * 6, "inputSchema": {"type": "object"}}
         for i in range(extra_tools)])}
    raw_config.write_text(json.dumps(config))
    reader, writer = os.pipe()
    os.close(reader)  # nobody will read what bastion prints
    try:
        done = subprocess.run([BASTION, "tools", str(raw_config)], stdout=writer, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, env=_environment(tmp_path), timeout=300)
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_a_log_record_shows_values_from_outside_escaped_and_never_as_a_record_of_their_own() -> None:
    import logging

    from bastion.cli.conventions import RecordFormatter

    formatter = RecordFormatter("bastion %(levelname)s %(name)s: %(message)s")
    subject = "alice\nbastion ERROR bastion.policy: forged\r\x1b[1A\u2028\u0085"
    record = logging.LogRecord("bastion.refusals", logging.INFO, __file__, 1, "refused %s for %s", ("tools/call", subject),
                               None)
    shown = formatter.format(record)
    first, *rest = shown.split("\n")
    assert first == "bastion INFO bastion.refusals: refused tools/call for alice"
    assert rest == ["    bastion ERROR bastion.policy: forged\\r\\x1b[1A\\u2028\\x85"]
    plain = logging.LogRecord("bastion", logging.INFO, __file__, 1, "plain text é 日本 %s", ("ok",), None)
    assert formatter.format(plain) == "bastion INFO bastion: plain text é 日本 ok"
