from __future__ import annotations

from pathlib import Path

import pytest

from bastion.search.embedding import EncoderUnavailable, load_default_encoder

REPO = Path(__file__).resolve().parents[2]
BFCL = REPO.parent / "shared" / "data" / "routing" / "bfcl"


def tool(name: str, description: str, **params: str) -> dict:
    return {
        "name": name,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
        },
    }


CATALOG = [
    tool("create_issue", "Open a new issue in a GitHub repository.", repo="Repository as owner/name", title="Issue title"),
    tool("list_pull_requests", "List the open pull requests of a GitHub repository.", repo="Repository as owner/name"),
    tool("get_weather", "Current weather conditions and temperature for a city.", city="City name"),
    tool("send_email", "Send an email message to a recipient.", to="Recipient address", body="Message text"),
    tool("read_file", "Read the contents of a file from the local filesystem.", path="Absolute file path"),
    tool("convertCurrency", "Convert an amount of money from one currency to another.", amount="Amount", target="Target currency code"),
    tool("query_database", "Run a read-only SQL query against the analytics database.", sql="The SELECT statement"),
    tool("translate_text", "Translate text into another language.", text="Text", language="Target language"),
]


def installed(loaded, what: str):
    """The encoder a loader returned; a missing packaged model fails the test run rather than skipping it."""
    if isinstance(loaded, EncoderUnavailable):
        pytest.fail(f"the packaged {what} must be installed for these tests: {loaded.reason}")
    return loaded


@pytest.fixture(scope="session")
def encoder():
    return installed(load_default_encoder(), "embedding model")
