"""The fuzz targets, in the order the suite and bench/fuzz.py run them, and where each one's seeds are kept."""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"  # corpus/<target>/: the minimised seeds kept in the repository
TARGETS = ("framing", "jsonrpc", "server_session", "client_session", "http_guards", "http_body", "config",
           "path_guard", "arg_guards", "scanners", "pin_diff")
