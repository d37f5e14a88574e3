"""The client the conformance suite's client scenarios test: Bastion's HTTP upstream.

The suite serves a mock MCP server and runs ``python tests/conformance/bastion_client.py URL`` with the scenario in
``MCP_CONFORMANCE_SCENARIO``, the spec revision in ``MCP_CONFORMANCE_PROTOCOL_VERSION`` and any data the scenario
hands over in ``MCP_CONFORMANCE_CONTEXT``. This command writes a Bastion configuration federating URL (``prefix =
""``, so the mock's tool names are unchanged; policy on, allowing everything), starts ``bastion run`` on it over
stdio, and drives the scenario's requests through it with the official SDK's client, in the revision's era. What
reaches the mock is what Bastion's upstream sends.

For the authorization scenarios (``auth/*``) the mock server asks for OAuth and the federated server is
``type = "authorization_code"``: Bastion runs the flow and logs the link a person would follow; this driver plays
that person, following every link Bastion gives (the mock authorization server approves at once and redirects to
Bastion's loopback callback), then lists the tools once the server is up and calls one, following any further link
(a step-up) and trying again, a few times at most.

Exit status 0 when every request the scenario makes was answered; what the mock saw is the suite's to judge.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.types import (
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitResult,
    ListRootsResult,
    TextContent,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

BASTION = str(Path(sys.executable).parent / "bastion")
DEADLINE = 120.0  # seconds any one request may take; the suite's own timeout ends a run that hangs sooner
ALLOW_ALL = "permit (principal, action, resource);\n"
# Set (to anything) by the control run that shows a known gap is the input-schema check's alone: the policy then
# lets arguments through that do not fit their tool's schema.
SCHEMA_CHECK_OFF = "BASTION_CONFORMANCE_SCHEMA_CHECK_OFF"
AUTH_PREFIX = "auth/"
# The Client ID Metadata Document URL Bastion is configured with: the one the suite's CIMD scenario expects.
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
# Bastion's log line that gives a person the link to authorize it (bastion/credentials/oauth_client.py).
LINK_LINE = re.compile(r"must authorize Bastion; the link is given to their client and is: (\S+)")
# The same link at the end of the message of a call Bastion refused for want of an authorization.
LINK_IN_MESSAGE = re.compile(r"(https?://\S+/authorize\?\S+)")
# Bastion's log lines that settle an authorization for good: it refused the answer the authorization server sent
# to its callback (another issuer, say), or refused the server's metadata before any link (another resource).
# Also the catalog's list refused for scope once Bastion stopped asking for more (the retry limit of step-ups).
REFUSAL_LINE = re.compile(r"an authorization redirect was refused|handshake failed: .*\brefused\b"
                          r"|tools/list failed: .*HTTP 403")
CALL_ATTEMPTS = 4  # a tool call refused for want of an authorization is tried again after its link is followed
# Bounds that only a broken run reaches: an authorized server joins within seconds (its handshake is retried with
# backoff), and a refusal ends the wait as soon as Bastion logs it.
TOOLS_WAIT = 45.0  # within the suite's own per-scenario timeout, so a wait that fails is reported as such
LINK_WAIT = 30.0  # for the link a refused call names to have been followed
POLL = 0.2  # how often the log and the tool list are looked at again


def bastion_config(folder: Path, url: str, scenario: str = "") -> Path:
    (folder / "allow-all.cedar").write_text(ALLOW_ALL)
    policy: dict[str, Any] = {"policy_files": ["allow-all.cedar"]}
    if os.environ.get(SCHEMA_CHECK_OFF):
        policy["schema_validation"] = False
    server: dict[str, Any] = {"url": url, "prefix": "", "trust": "trusted", "request_timeout": DEADLINE}
    if scenario.startswith(AUTH_PREFIX):
        server["auth"] = authorization(context(), scenario, folder)
        if server["auth"]["type"] == "authorization_code":
            server["scope"] = "per_identity"
    config = {
        "policy": policy,
        "tools": {"exposure": "all"},  # the scenarios' servers' own tool lists, as they are
        "ready_timeout": 60,
        "servers": {"mock": server},
    }
    path = folder / "bastion.json"
    path.write_text(json.dumps(config))
    return path


def authorization(given: dict[str, Any], scenario: str = "", folder: Path | None = None) -> dict[str, Any]:
    """The server's auth table. The suite's authorization extensions get theirs from what the scenario hands over
    (``extension_authorization``); every other scenario the specification's flow: a pre-registered client when the
    scenario hands one over, else the CIMD URL (used only where the authorization server accepts such documents;
    dynamic registration otherwise)."""
    if scenario in EXTENSIONS:
        assert folder is not None
        return EXTENSIONS[scenario](given, folder)
    auth: dict[str, Any] = {"type": "authorization_code", "client_metadata_url": CLIENT_METADATA_URL}
    if given.get("client_id"):
        auth["client_id"] = given["client_id"]
        if given.get("client_secret"):
            auth["client_secret"] = given["client_secret"]
    return auth


def _secret_file(folder: Path, name: str, value: str) -> str:
    """``value`` in a file of its own (mode 0600), referenced as ``${file:...}`` as a deployment would."""
    path = folder / name
    path.write_text(value)
    path.chmod(0o600)
    return f"${{file:{path}}}"


def client_credentials_jwt(given: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Client credentials with a signed assertion (RFC 7523, SEP-1046): the suite hands over the client id and a
    PEM private key; the authorization server is the one the server's protected resource metadata names."""
    key = folder / "client-key.pem"
    key.write_text(given["private_key_pem"])
    key.chmod(0o600)
    return {"type": "client_credentials", "client_id": given["client_id"],
            "token_endpoint_auth_method": "private_key_jwt", "private_key_file": str(key),
            "signing_algorithm": given.get("signing_algorithm", "ES256")}


def client_credentials_basic(given: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Client credentials with a client secret (HTTP Basic); the authorization server found from the server."""
    return {"type": "client_credentials", "client_id": given["client_id"],
            "client_secret": _secret_file(folder, "client-secret", given["client_secret"])}


def enterprise_managed(given: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Enterprise-managed authorization (SEP-990): the suite hands over the user's ID token from the enterprise
    identity provider, Bastion's client there, and Bastion's client at the MCP server's authorization server."""
    return {"type": "enterprise_managed", "client_id": given["client_id"],
            "client_secret": _secret_file(folder, "client-secret", given["client_secret"]),
            "idp": {"issuer": given["idp_issuer"], "client_id": given["idp_client_id"],
                    "subject_token": _secret_file(folder, "id-token", given["idp_id_token"])}}


# The suite's authorization extensions Bastion implements, each with its auth table; the others (DPoP, workload
# identity federation) are not attempted (runs.py).
EXTENSIONS: dict[str, Callable[[dict[str, Any], Path], dict[str, Any]]] = {
    "auth/client-credentials-jwt": client_credentials_jwt,
    "auth/client-credentials-basic": client_credentials_basic,
    "auth/enterprise-managed-authorization": enterprise_managed,
}


def client_mode(revision: str | None) -> str:
    """The era the client speaks to Bastion in: the revision the suite runs the scenario at."""
    return "legacy" if revision and revision not in MODERN_PROTOCOL_VERSIONS else "2026-07-28"


# ------------------------------------------------------------------------------- what the client answers Bastion
async def answer_sampling(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text=""), model="conformance-stub")


async def answer_roots(context: Any) -> ListRootsResult:
    return ListRootsResult(roots=[])


async def accept_with_defaults(context: Any, params: Any) -> ElicitResult:
    """Accept, filling every field the form gives a default for (SEP-1034), and confirm anything asked."""
    content: dict[str, Any] = {}
    if isinstance(params, ElicitRequestFormParams):
        for name, field in params.requested_schema.get("properties", {}).items():
            if "default" in field:
                content[name] = field["default"]
            elif field.get("type") == "boolean":
                content[name] = True
    return ElicitResult(action="accept", content=content)


# ------------------------------------------------------------------------------------------------- the scenarios
def stub_arguments(input_schema: dict[str, Any]) -> dict[str, Any]:
    """The least arguments that satisfy a tool's required ones."""
    by_type = {"string": "x", "integer": 0, "number": 0, "boolean": False, "object": {}, "array": [], "null": None}
    properties = input_schema.get("properties", {})
    return {name: by_type.get(properties.get(name, {}).get("type"), "x") for name in input_schema.get("required", [])}


def context() -> dict[str, Any]:
    return json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")


async def list_only(client: Client) -> None:
    await client.list_tools()


async def add_numbers(client: Client) -> None:
    await client.list_tools()
    await client.call_tool("add_numbers", {"a": 5, "b": 3})


async def add_numbers_if_listed(client: Client) -> None:
    """The scenario's server may list no tool (request-metadata judges the requests' _meta): a tool it does not
    list is not called, which would only fail as unknown."""
    if any(tool.name == "add_numbers" for tool in (await client.list_tools()).tools):
        await client.call_tool("add_numbers", {"a": 5, "b": 3})


def list_then_call(*names: str) -> Callable[[Client], Awaitable[None]]:
    async def scenario(client: Client) -> None:
        await client.list_tools()
        for name in names:
            await client.call_tool(name, {})

    return scenario


async def one_of_each_kind(client: Client) -> None:
    tools = (await client.list_tools()).tools
    if tools:
        await client.call_tool(tools[0].name, stub_arguments(tools[0].input_schema))
    resources = (await client.list_resources()).resources
    if resources:
        await client.read_resource(resources[0].uri)
    prompts = (await client.list_prompts()).prompts
    if prompts:
        await client.get_prompt(prompts[0].name)


async def every_listed_tool(client: Client) -> None:
    # the mock lists tools with malformed x-mcp-header annotations, which a conforming client leaves out
    for tool in (await client.list_tools()).tools:
        await call_and_report(client, tool.name, stub_arguments(tool.input_schema))


async def the_calls_given(client: Client) -> None:
    listed = {tool.name for tool in (await client.list_tools()).tools}
    for call in context().get("toolCalls", []):
        if call["name"] in listed:
            await call_and_report(client, call["name"], call.get("arguments") or {})


async def echo_the_schema(client: Client) -> None:
    tools = (await client.list_tools()).tools
    focal = next(tool for tool in tools if tool.name == "json_schema_2020_12_tool")
    await client.call_tool("json_schema_echo", {"schema": focal.input_schema})


class Person:
    """The user at the browser: follows each authorization link Bastion logs, once, and notices when Bastion has
    refused an authorization for good."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self.followed: set[str] = set()
        self.refused = False

    async def follow_links(self) -> None:
        async with httpx2.AsyncClient(follow_redirects=True, timeout=30) as browser:
            while True:
                text = self._log.read_text(errors="replace") if self._log.exists() else ""
                for link in LINK_LINE.findall(text):
                    if link not in self.followed:
                        try:
                            page = await browser.get(link)
                            print(f"bastion-client: followed an authorization link: HTTP {page.status_code}",
                                  file=sys.stderr)
                        except httpx2.HTTPError as exc:
                            print(f"bastion-client: an authorization link failed: {exc!r}", file=sys.stderr)
                        self.followed.add(link)
                self.refused = self.refused or bool(REFUSAL_LINE.search(text))
                await anyio.sleep(POLL)


class ToolsMissing(Exception):
    """The server's tools never appeared though nothing was refused: the run failed (exit status 1)."""


async def authorized_calls(client: Client, person: Person) -> None:
    """List the tools once the server is up (after its authorization), then call the first one, trying again after
    a refusal once the link it names has been followed (a step-up). Bastion refusing the authorization for good
    settles the scenario: nothing more comes, so nothing more is waited for."""
    tools: list[Any] = []
    with anyio.move_on_after(TOOLS_WAIT):
        while not tools and not person.refused:
            tools = (await client.list_tools()).tools
            if not tools:
                await anyio.sleep(POLL)
    if not tools:
        if person.refused:
            print("bastion-client: the server's tools did not appear: Bastion refused the authorization",
                  file=sys.stderr)
            return
        raise ToolsMissing(f"the server's tools did not appear within {TOOLS_WAIT:g}s")
    for attempt in range(CALL_ATTEMPTS):
        try:
            await client.call_tool(tools[0].name, stub_arguments(tools[0].input_schema))
            return
        except Exception as exc:  # noqa: BLE001 - refused for want of an authorization: follow, then try again
            print(f"bastion-client: call {attempt + 1} refused: {exc}", file=sys.stderr)
            message = str(exc)
            if not LINK_IN_MESSAGE.search(message):
                return  # refused without a way to authorize: trying again would be refused the same way
            with anyio.move_on_after(LINK_WAIT):
                while not any(link in message for link in person.followed):
                    await anyio.sleep(POLL)


async def call_and_report(client: Client, name: str, arguments: dict[str, Any]) -> None:
    """A call the scenario expects may be refused: it is reported, and the run goes on."""
    try:
        await client.call_tool(name, arguments)
    except Exception as exc:  # noqa: BLE001 - reported, and the scenario judges
        print(f"bastion-client: {name} refused: {exc}", file=sys.stderr)


SCENARIOS: dict[str, Callable[[Client], Awaitable[None]]] = {
    "initialize": list_only,
    "json-schema-ref-no-deref": list_only,
    "json-schema-2020-12-preservation": echo_the_schema,
    "tools_call": add_numbers,
    "request-metadata": add_numbers_if_listed,
    "sse-retry": list_then_call("test_reconnection"),
    "elicitation-sep1034-client-defaults": list_then_call("test_client_elicitation_defaults"),
    "sep-2322-client-request-state": list_then_call(
        "test_mrtr_echo_state", "test_mrtr_unrelated", "test_mrtr_no_state", "test_mrtr_no_result_type"
    ),
    "http-standard-headers": one_of_each_kind,
    "http-invalid-tool-headers": every_listed_tool,
    "http-custom-headers": the_calls_given,
}


async def run(url: str, scenario: str, revision: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="bastion-conformance-client-") as folder:
        config = bastion_config(Path(folder), url, scenario)
        # Its own state (audit trail, pins, tokens): scenarios run side by side never read each other's.
        state = {**os.environ, "XDG_STATE_HOME": str(Path(folder) / "state")}
        if not scenario.startswith(AUTH_PREFIX):
            server = StdioServerParameters(command=BASTION, args=["run", str(config), "-q"], env=state)
            await drive(server, SCENARIOS[scenario], revision)
            return
        # Bastion's stderr goes to a file the person reads links from.
        log = Path(folder) / "bastion.log"
        server = StdioServerParameters(command="/bin/sh", args=["-c", 'exec "$0" run "$1" -q 2>>"$2"', BASTION,
                                                                str(config), str(log)], env=state)
        person = Person(log)
        try:
            async with anyio.create_task_group() as running:
                running.start_soon(person.follow_links)
                await drive(server, lambda client: authorized_calls(client, person), revision)
                running.cancel_scope.cancel()
        finally:
            if log.exists():
                sys.stderr.write(log.read_text(errors="replace"))


async def drive(server: StdioServerParameters, scenario: Callable[[Client], Awaitable[None]],
                revision: str | None) -> None:
    async with Client(
        server, mode=client_mode(revision), read_timeout_seconds=DEADLINE,
        sampling_callback=answer_sampling, list_roots_callback=answer_roots,
        elicitation_callback=accept_with_defaults,
    ) as client:
        with anyio.fail_after(DEADLINE):
            await scenario(client)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: bastion_client.py URL (the conformance suite appends the URL)", file=sys.stderr)
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    if scenario not in SCENARIOS and not scenario.startswith(AUTH_PREFIX):
        print(f"bastion-client: no driver for scenario {scenario!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    try:
        anyio.run(run, sys.argv[1], scenario, os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION"))
    except Exception:  # noqa: BLE001 - the whole story goes to stderr, which the suite keeps
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
