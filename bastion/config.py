"""Bastion's configuration: the typed model, the file formats it is read from, and the built-in default.

Two formats are read: Bastion's own file (TOML or JSON, a ``servers`` table) and the ``mcpServers`` JSON that
Claude Desktop, Cursor and VS Code (``servers``) already use. Every error names the file, the key and the fix.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from bastion import paths
from bastion.argument_paths import absolute_argument
from bastion.auth.config import AuthConfig
from bastion.clients.grants import with_inferred_grants
from bastion.credentials.config import UpstreamAuth
from bastion.finding import Finding
from bastion.jsonc import parse_jsonc
from bastion.public_key_pins import pin_problem
from bastion.plaintext import PLAINTEXT_ERROR, PLAINTEXT_FIX, is_plaintext_remote, plaintext_refusal
from bastion.guardrails.config import GuardrailsConfig
from bastion.observability.tracing_config import NOT_ECHOED, TracingConfig
from bastion.observability.config import MetricsConfig
from bastion.protocol.jsonrpc import DEFAULT_MAX_MESSAGE_BYTES
from bastion.policy.config import PolicyConfig
from bastion.sandbox.config import SandboxConfig
from bastion.state.config import StateConfig
from bastion.variables import Variables, VariableError, read_dotenv

log = logging.getLogger("bastion.config")

# Keys that other clients put in mcpServers entries and that mean nothing to Bastion: dropped.
_FOREIGN_ENTRY_KEYS = {"type", "timeout", "description", "transportType"}
# Keys a client entry has that Bastion reads itself (into enabled, auto_approve and env).
_CLIENT_ENTRY_KEYS = {"disabled", "autoApprove", "alwaysAllow", "envFile"}
# A tuple, not a set: the "type" looked up in it may be any JSON value, and a set cannot take an object.
_REMOTE_TYPES = ("http", "sse", "streamable-http", "streamableHttp")
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(default=None, min_length=1, description="the executable to start (or url)")
    url: str | None = Field(default=None, description="a remote server's MCP endpoint (http:// or https://), "
                            "instead of command")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers sent to a remote server "
                                    "(static credentials; ${env:NAME} is read from Bastion's environment)")
    transport: Literal["auto", "streamable-http", "sse"] = Field(
        default="auto", description="a remote server's transport; auto tries Streamable HTTP, then HTTP+SSE")
    sse_idle_timeout: float = Field(default=60.0, gt=0, description="seconds a remote server's event stream may "
                                    "stay silent before it is taken for dropped (reopened, or reconnected)")
    allow_plaintext: bool = Field(default=False, strict=True, description="true: a remote server may be reached over "
                                  "http:// at a host other than loopback, unencrypted and unauthenticated; without "
                                  "it such a url is refused (loopback, https:// need nothing)")
    ca_file: str | None = Field(default=None, description="a remote server's certificate authorities (PEM), for a "
                                "private CA; default: the system's trust store")
    pinned_public_keys: list[str] = Field(
        default_factory=list, description="https:// remote only: the sha256//BASE64 pins (HPKP, curl --pinnedpubkey) "
        "of the public keys the server's leaf certificate may carry, one string or a list for a rotation; a "
        "connection presenting another key is refused before any request is sent")
    auth: UpstreamAuth | None = Field(default=None, description="how Bastion authenticates to a remote server "
                                      "(OAuth client credentials, token exchange, per-user authorization); never "
                                      "the caller's own token")
    client_cert: str | None = Field(default=None, description="a client certificate (PEM) Bastion presents to a "
                                    "remote server that asks for mutual TLS")
    client_key: str | None = Field(default=None, description="its private key (PEM); absent: in client_cert's file")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="variables set for this server only")
    identity_env: dict[str, str] = Field(
        default_factory=dict, description="per_identity: variable -> secret name, set in each identity's process "
        "from the secret `bastion credentials set USER SERVER NAME` stored for that user")
    cwd: str | None = None
    prefix: str | None = Field(
        default=None, description='prefix for tool and prompt names; default: the server name; "" for none'
    )
    trust: Literal["untrusted", "reviewed", "trusted"] = "untrusted"
    era: Literal["auto", "legacy", "modern"] = Field(
        default="auto", description="protocol era; auto probes server/discover and falls back to initialize"
    )
    request_timeout: float = Field(default=120.0, gt=0, description="seconds before an unanswered request fails")
    startup_timeout: float = Field(default=30.0, gt=0)
    scope: Literal["shared", "per_identity", "per_session"] = Field(
        default="shared", description="one process for every client (shared), one per identity, or one per client "
        "session, for a stateful server whose state must not mix between agents")
    idle_timeout: float = Field(default=600.0, gt=0, description="per_identity/per_session: seconds an instance may "
                                "go unused before it is stopped")
    max_instances: int = Field(default=16, ge=1, description="per_identity/per_session: most instances running at "
                               "once; a caller past it is refused with -32000 and retryAfterSeconds")
    max_queued_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="a local server that stops reading its stdin: bytes Bastion "
        "may hold for it; past them a request to it is refused at once with -32000 and retryAfterSeconds, and the "
        "other servers serve on")
    enabled: bool = True
    auto_approve: list[str] = Field(
        default_factory=list,
        description="tools (as the server names them) approved in advance, from a client's autoApprove/alwaysAllow",
    )
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description='OS sandbox profile and grants; "none" only when written explicitly'
    )
    # The configuration file the server was read from (None: built in); its launcher lock file is found from it.
    _config_file: Path | None = PrivateAttr(default=None)
    # Whether that file is a client's (mcpServers, VS Code's servers): its lock is kept in the state directory.
    _client_file: bool = PrivateAttr(default=False)

    @property
    def config_file(self) -> Path | None:
        return self._config_file

    @property
    def client_file(self) -> bool:
        return self._client_file

    @property
    def is_remote(self) -> bool:
        """A server reached over HTTP at ``url``: no process, no sandbox."""
        return self.url is not None

    @field_validator("command")
    @classmethod
    def _no_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("command must not be blank")
        return value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {value!r}")
        return value

    @field_validator("pinned_public_keys", mode="before")
    @classmethod
    def _pins(cls, value: Any) -> Any:
        pins = [value] if isinstance(value, str) else value
        if isinstance(pins, list):
            for pin in pins:
                problem = pin_problem(pin) if isinstance(pin, str) else "each pin must be a string"
                if problem is not None:
                    raise ValueError(f"pinned_public_keys: {problem}")
        return pins

    @field_validator("headers")
    @classmethod
    def _header_names(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an HTTP header name (letters, digits and -)")
            if "\r" in value or "\n" in value:
                raise ValueError(f"the value of header {name} must be one line")
        return headers

    @model_validator(mode="wrap")
    @classmethod
    def _command_or_url(cls, data: Any, handler: Any) -> "ServerConfig":
        neither = isinstance(data, dict) and "command" not in data and "url" not in data
        if not neither:
            server = handler(data)
        else:
            # A missing command is reported with the entry's other mistakes, as before url existed.
            try:
                handler(data)
                details = []
            except ValidationError as exc:
                details = [{k: e[k] for k in ("type", "loc", "input", "ctx") if k in e} for e in exc.errors()]
            missing = {"type": "missing", "loc": ("command",), "input": data}
            raise ValidationError.from_exception_data(cls.__name__, [*details, missing])
        if server.command is not None and server.url is not None:
            raise ValueError("give either command (a local server) or url (a remote one), not both")
        remote_only = {"headers", "transport", "sse_idle_timeout", "ca_file", "auth", "client_cert",
                       "client_key", "allow_plaintext", "pinned_public_keys"} & server.model_fields_set
        if server.url is None and remote_only:
            raise ValueError(f"{', '.join(sorted(remote_only))}: for remote (url) servers only")
        local_only = {"args", "env", "cwd", "sandbox", "identity_env"} & server.model_fields_set
        if server.url is not None and local_only:
            raise ValueError(f"{', '.join(sorted(local_only))}: for local (command) servers only; a remote server is "
                             "not started by Bastion")
        if server.url is not None and is_plaintext_remote(server.url) and not server.allow_plaintext:
            raise ValidationError.from_exception_data(cls.__name__, [{
                "type": PydanticCustomError(PLAINTEXT_ERROR, "{message}", {"message": plaintext_refusal(server.url)}),
                "loc": ("url",), "input": server.url}])
        if server.pinned_public_keys and not (server.url or "").lower().startswith("https://"):
            raise ValueError("pinned_public_keys: a pin is checked in the TLS handshake, so the url must be https://")
        _check_credentials(server)
        return server


def _check_credentials(server: ServerConfig) -> None:
    """Per-user credentials need an instance per user: a shared one would carry one user's token for everyone."""
    per_user = server.auth is not None and (
        server.auth.type in ("token_exchange", "authorization_code")
        or (server.auth.type == "enterprise_managed" and server.auth.idp is not None
            and server.auth.idp.subject_token is None))  # the caller's own token is the identity assertion
    if per_user and server.scope != "per_identity":
        raise ValueError(f'auth type "{server.auth.type}" gives each caller a token of their own: set scope = '  # type: ignore[union-attr]
                         '"per_identity" on this server, so that each identity has a connection of its own')
    if server.identity_env and server.scope != "per_identity":
        raise ValueError('identity_env sets a secret of each caller in that caller\'s process: set scope = '
                         '"per_identity" on this server')
    if server.auth is not None and any(name.lower() == "authorization" for name in server.headers):
        raise ValueError("headers.Authorization and auth would both set the Authorization header: keep auth and "
                         "remove the header, or remove auth")
    if server.client_key is not None and server.client_cert is None:
        raise ValueError("client_key needs client_cert, the certificate it is the key of")


# The ``http`` table: how ``bastion serve --http`` listens, whom it trusts, and its bounds. The tables of the parts
# below the configuration (auth, credentials, policy, guardrails, sandbox) live in their packages; those of the
# gateway and its frontends, which read the whole configuration, live here.
MIB = 1024 * 1024


class HttpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allowed_origins: list[str] = Field(
        default_factory=list,
        description="browser Origins allowed besides the loopback ones, e.g. https://app.example.com; '*' allows any")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header values accepted (DNS-rebinding protection); empty: the loopback names on a loopback "
                    "bind, any host otherwise")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses or networks (CIDR) whose X-Forwarded-For/-Proto/-Host headers are believed; "
                    "empty: none are")
    tls_cert: Path | None = Field(default=None, description="PEM certificate chain; with tls_key, serve HTTPS")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert")
    client_ca_file: Path | None = Field(
        default=None, description="PEM certificates of the authorities that sign client certificates: with TLS, "
                                  "clients present a certificate the handshake verifies (mutual TLS), mapped to an "
                                  "identity by auth.client_certificates")
    client_cert_mode: Literal["required", "optional"] = Field(
        default="required", description="with client_ca_file: 'required' ends a handshake without a valid client "
                                        "certificate; 'optional' also lets in clients without one (a bearer token or "
                                        "API key then decides); an invalid certificate is refused either way")
    max_body_bytes: int = Field(default=4 * MIB, ge=1024, description="larger request bodies are answered with 413")
    body_timeout: float = Field(default=30.0, gt=0, description="seconds a client may take to send one request body")
    header_timeout: float = Field(
        default=10.0, gt=0, description="seconds a connection has, from its start or its previous response's end, "
                                        "until a request's line and headers are complete: a late request gets 408, "
                                        "an idle connection is closed")
    max_connections: int = Field(
        default=4096, ge=2, description="client connections open at once; past it a new one is answered 503 and "
                                        "closed (lowered to fit the open-file limit if that is short)")
    max_connections_per_address: int = Field(
        default=256, ge=1, description="client connections open at once from one address (an IPv6 one: its /64), "
                                       "below max_connections; trusted_proxies are exempt")
    max_in_flight_per_server: int = Field(
        default=64, ge=1, description="requests (tools/call, prompts/get, resources/read, ...) one server may have in "
                                  "flight from all clients together")
    retry_after_seconds: int = Field(
        default=1, ge=0, description="what a refusal for a full server or too many connections tells the client")
    max_sessions: int = Field(
        default=10000, ge=1, description="open sessions at most, handshake-era Streamable HTTP and HTTP+SSE together")
    max_sessions_per_identity: int = Field(
        default=100, ge=1, description="open sessions (both kinds) one authenticated identity may hold; past it a "
                                       "new one is refused with 429, while other identities still get theirs")
    max_sessions_per_address: int = Field(
        default=100, ge=1, description="without authentication (every caller is the configured identity): open "
                                       "sessions one client address may hold, an IPv6 address counted by its /64")
    session_idle_timeout: float = Field(default=3600.0, gt=0, description="seconds after which a quiet session ends")
    heartbeat_seconds: float = Field(default=15.0, gt=0, description="an SSE comment after this long without events")
    stream_buffer_messages: int = Field(
        default=1024, ge=8, description="messages one SSE stream may hold for a client that is not reading; past "
                                        "it the stream is closed")
    stream_buffer_bytes: int = Field(
        default=16 * 1024 * 1024, ge=65536, description="bytes of messages one SSE stream may hold for a client that "
        "is not reading; past them the stream is closed, as past stream_buffer_messages (one message alone always "
        "passes)")
    replay_events: int = Field(default=256, ge=0, description="events of a GET stream kept for Last-Event-ID")
    resume_seconds: float = Field(
        default=10.0, ge=0, description="how long a 2025-11-25 call whose answer stream dropped waits for its client "
                                        "to resume it with Last-Event-ID before it is cancelled; 0: answer streams "
                                        "are not resumable and a dropped one cancels its call at once")
    session_key_files: list[str] = Field(
        default_factory=list,
        description="with a shared [state] store: files of the keys (64 hex digits each) that seal the session "
                    "records replicas share, so a handshake-era session continues on any replica; the first seals, "
                    "every one opens (rotate: put a new file first, drop the old one a session_idle_timeout later); "
                    "none: sessions stay on the replica that made them")
    identity_header: str | None = Field(
        default=None, description="a request header whose value is the caller's identity, e.g. X-Bastion-Identity; "
                                  "a stand-in until OAuth, off unless set")

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
        return value

    @field_validator("identity_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and (not value or not all(c.isalnum() or c in "-_" for c in value)):
            raise ValueError(f"{value!r} is not a header name (letters, digits, '-')")
        return value

    @model_validator(mode="after")
    def _one_address_never_takes_all(self) -> "HttpConfig":
        if self.max_connections_per_address >= self.max_connections:
            raise ValueError(f"max_connections_per_address ({self.max_connections_per_address}) must be below "
                             f"max_connections ({self.max_connections}), or one address can take every connection")
        return self

    @model_validator(mode="after")
    def _quotas_below_the_bound(self) -> "HttpConfig":
        # Left at its default, a quota above a smaller max_sessions is simply never reached; set above it, it says
        # something the gateway cannot do.
        for key in ("max_sessions_per_identity", "max_sessions_per_address"):
            if key in self.model_fields_set and getattr(self, key) > self.max_sessions:
                raise ValueError(f"http.{key} ({getattr(self, key)}) is more than http.max_sessions "
                                 f"({self.max_sessions}), which bounds every session: lower it, or raise max_sessions")
        return self


def client_certificate_contradiction(http: HttpConfig, auth: AuthConfig | None) -> str | None:
    """What is contradictory in the mutual-TLS settings of the http and auth tables, with the fix; None when
    nothing is. (Whether TLS is on at all is known only when ``bastion serve``'s flags are read.)"""
    mapped = auth is not None and bool(auth.client_certificates)
    if http.client_ca_file is None and mapped:
        return ("auth.client_certificates maps client certificates, but none is asked for: set http.client_ca_file "
                "to the PEM file of the authorities that sign them")
    if http.client_ca_file is not None and http.client_cert_mode == "optional" and not mapped:
        return ('http.client_cert_mode = "optional" lets in clients without a certificate, and with no '
                "auth.client_certificates a certificate decides nothing: map certificates to identities there, or "
                'make client_cert_mode "required"')
    return None


class ToolsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    exposure: Literal["auto", "all", "search"] = Field(
        default="auto", description="auto: every tool while the catalog has at most 10 tools and 5,000 tokens of "
                                    "definitions, search mode past that; all: list every permitted tool; search: list "
                                    "search_tools and call_tool"
    )
    always_list: list[str] = Field(default_factory=list, description="tools listed in search mode too (exposed names)")
    # MiniLM's cost per tool grows with its text: 128 word pieces keep the parameters (the best
    # recall), 32 about the name and the description's first sentence (a 10,000-tool catalog
    # embedded about three times faster, for about 1.5 points of Recall@5 on BFCL).
    embedding_tokens: int = Field(
        default=128, ge=16, le=256, description="word pieces of each tool's text the sentence model reads in search mode"
    )


class ReloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    watch: bool = Field(default=True, strict=True, description="reload when the configuration file or a policy file "
                                                               "it names changes (SIGHUP reloads either way)")
    interval: float = Field(default=1.0, gt=0, le=60, description="seconds between looks at the watched files; a "
                                                                   "change is applied once a look finds it settled")


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    page_size: int = Field(default=0, ge=0, description="items per list page sent to clients; 0 sends one page")
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    policy: PolicyConfig | None = Field(
        default_factory=lambda: default_policy(),
        description='authorization, guards, approval, rate limits and audit; absent: the default policy; "off": none',
    )
    ready_timeout: float = Field(default=5.0, gt=0, description="how long a client's first request waits for servers")
    http: HttpConfig = Field(default_factory=HttpConfig, description="how `bastion serve --http` listens and its bounds")
    auth: AuthConfig | None = Field(
        default=None, description="how `bastion serve --http` authenticates callers (OAuth 2.1 bearer tokens, API "
                                  "keys, client certificates); absent: every request is policy.identity")
    guardrails: GuardrailsConfig | None = Field(
        default_factory=GuardrailsConfig,
        description='content guardrails (pinning, secrets, PII, injection, taint, sampling); "off": none',
    )
    tracing: TracingConfig | None = Field(
        default=None, description="OpenTelemetry traces exported over OTLP/HTTP; absent: no tracing (nothing of "
                                  "OpenTelemetry is loaded)")
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig,
        description="Prometheus metrics at /metrics (admin identities on the HTTP listener, or a separate listener)")
    reload: ReloadConfig = Field(default_factory=ReloadConfig, description="hot reload: the file watch")
    state: StateConfig | None = Field(
        default=None, description="the Redis that replicas of this gateway share their state in (rate limits, "
                                  "approvals, sessions, ...); absent: this process's memory")
    # The file this configuration was read from (None: built in); what lives beside it, such as the launcher lock
    # file, is found from here.
    _source: Path | None = PrivateAttr(default=None)
    _client_file: bool = PrivateAttr(default=False)
    # What loading noticed and let through (a remote entry skipped, a client key ignored); `bastion check` reports it.
    _notes: tuple[Finding, ...] = PrivateAttr(default=())
    # The key the servers were read from ("mcpServers" in a client's file), so findings name the key the user wrote.
    _servers_key: str = PrivateAttr(default="servers")

    @property
    def source(self) -> Path | None:
        return self._source

    def with_source(self, source: Path | None, client_file: bool = False) -> "GatewayConfig":
        self._source = source
        self._client_file = client_file
        for server in self.servers.values():
            server._config_file = source
            server._client_file = client_file
        return self

    @property
    def client_file(self) -> bool:
        """Whether the configuration is a client's file (``mcpServers``, VS Code's ``servers``), not Bastion's own."""
        return self._client_file

    @property
    def load_notes(self) -> tuple[Finding, ...]:
        return self._notes

    def with_notes(self, notes: "list[Finding] | tuple[Finding, ...]", servers_key: str = "servers") -> "GatewayConfig":
        self._notes = tuple(notes)
        self._servers_key = servers_key
        return self

    @property
    def servers_key(self) -> str:
        return self._servers_key

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_switch(cls, value: Any) -> Any:
        # Security is on unless turned off in so many words: `policy = "off"` (or false) means no policy, no audit.
        return _on_unless_off(value, default_policy, 'policy must be a table of policy settings, or "off" for no '
                              'policy and no audit')

    @field_validator("guardrails", mode="before")
    @classmethod
    def _guardrails_switch(cls, value: Any) -> Any:
        return _on_unless_off(value, GuardrailsConfig, 'guardrails must be a table of guardrail settings, or "off" '
                              'for none')

    @field_validator("servers")
    @classmethod
    def _valid_names(cls, servers: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in servers:
            if not name or "/" in name or name != name.strip():
                raise ValueError(f"server name {name!r} must be non-empty, without '/' or surrounding spaces")
        return servers

    @model_validator(mode="after")
    def _policy_names_servers(self) -> "GatewayConfig":
        # A misspelt name would leave the server it meant under the gateway-wide setting without a word.
        unknown = sorted(set(self.policy.servers) - set(self.servers)) if self.policy is not None else []
        if unknown:
            raise ValueError(f"policy.servers names {', '.join(map(repr, unknown))}, which is not a configured "
                             "server: use a name from the servers table, or remove the entry")
        return self

    @model_validator(mode="after")
    def _guardrails_name_servers(self) -> "GatewayConfig":
        unknown = sorted(set(self.guardrails.servers) - set(self.servers)) if self.guardrails is not None else []
        if unknown:
            raise ValueError(f"guardrails.servers names {', '.join(map(repr, unknown))}, which is not a configured "
                             "server: use a name from the servers table, or remove the entry")
        budgets = sorted(set(self.guardrails.sampling_budget.servers) - set(self.servers)) \
            if self.guardrails is not None else []
        if budgets:
            raise ValueError(f"guardrails.sampling_budget.servers names {', '.join(map(repr, budgets))}, which is not "
                             "a configured server: use a name from the servers table, or remove the entry")
        consents = sorted(set(self.guardrails.consent.servers) - set(self.servers)) \
            if self.guardrails is not None else []
        if consents:
            raise ValueError(f"guardrails.consent.servers names {', '.join(map(repr, consents))}, which is not a "
                             "configured server: use a name from the servers table, or remove the entry")
        allow = self.guardrails.cross_server.allow if self.guardrails is not None else {}
        paired = sorted({name for reader, owners in allow.items() for name in (reader, *owners)} - {"*"}
                        - set(self.servers))
        if paired:
            raise ValueError(f"guardrails.cross_server.allow names {', '.join(map(repr, paired))}, which is not a "
                             "configured server: use names from the servers table (\"*\" for every server)")
        if self.http.identity_header is not None and self.auth is not None and (
                self.auth.issuers or self.auth.api_keys is not None or self.auth.client_certificates):
            raise ValueError("http.identity_header and the auth table cannot be used together: anyone could name "
                             "anyone in the header, past the tokens, keys or certificates auth asks for; remove "
                             "http.identity_header")
        if (contradiction := client_certificate_contradiction(self.http, self.auth)) is not None:
            raise ValueError(contradiction)
        return self


def _on_unless_off(value: Any, default: Any, wrong_text: str) -> Any:
    """A section that is on unless turned off in so many words: "off" or false is None, true is its defaults
    (``default()``), other text is an error (``wrong_text``), and a table is read as the section."""
    if value is False or value == "off":
        return None
    if value is True:
        return default()
    if isinstance(value, str):
        raise ValueError(wrong_text)
    return value


class ConfigError(Exception):
    """A configuration that cannot be used; the message says where and how to fix it."""

    def __init__(self, message: str, findings: "list[Finding] | tuple[Finding, ...]" = ()) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


def default_policy() -> PolicyConfig:
    """The policy a configuration gets unless it says otherwise: the shipped Cedar policy, audit on, and approvals
    waiting in the local queue (`bastion approvals`, `bastion approve ID`) when the client cannot ask the person."""
    return PolicyConfig.model_validate({"approval": {"fallback": "queue"}})


def load_config(path: str | os.PathLike[str] | None, *, log_notes: bool = True) -> GatewayConfig:
    """Read a configuration file, or the built-in default when ``path`` is None.

    What loading let through with a finding (a server left out, a key ignored) is logged unless ``log_notes`` is
    false; it is kept in ``load_notes`` either way, for ``bastion check``.
    """
    if path is None:
        return default_config()
    file = Path(path)
    try:
        text = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the configuration: {exc.strerror}") from None
    data = _parse(file, text)
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be an object/table, not {type(data).__name__}")
    client_file = _client_servers_key(file, data) is not None
    data, servers_key, notes = _normalize(file, data)
    data = _expand_state(file, data)
    policy = data.get("policy")
    if isinstance(policy, dict) and "base_dir" not in policy:
        # Policy files named relative to the configuration are read from beside it.
        data = {**data, "policy": {**policy, "base_dir": str(file.resolve().parent)}}
    try:
        config = GatewayConfig.model_validate(data).with_source(file.resolve(), client_file).with_notes(notes,
                                                                                                        servers_key)
    except ValidationError as exc:
        invalid = _validation_findings(exc, servers_key, file.suffix.lower() == ".toml")
        raise ConfigError(_explain(file, invalid), [*notes, *invalid]) from None
    if log_notes:
        for note in notes:
            log.log(logging.ERROR if note.level == "error" else logging.WARNING, "%s: %s: %s — fix: %s",
                    file, note.where, note.message, note.fix)
    return config


def written(file: Path) -> Any:
    """The file's data as written, before variables are expanded: what `bastion check` reads to tell a value given
    in plain text from one that comes from ``${env:NAME}``."""
    try:
        return _parse(file, file.read_bytes())
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the configuration: {exc.strerror}") from None


def _parse(file: Path, text: bytes) -> Any:
    if file.suffix == ".toml":
        try:
            return tomllib.loads(text.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        except RecursionError:  # tomllib reads nested arrays and tables by recursion, with no bound of its own
            raise ConfigError(f"{file}: not valid TOML: nested too deeply") from None
    try:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            # Comments and trailing commas, as clients' files hold them (VS Code's by default): the same reading
            # import gives the file, with positions as the editor shows them.
            return parse_jsonc(text.decode("utf-8-sig"))
    except RecursionError:  # as deep as Python's recursion: no configuration nests so
        raise ConfigError(f"{file}: not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # ValueError: JSONDecodeError, or an integer of over 4,300 digits
        hint = " (a .toml file name selects TOML)" if file.suffix != ".json" else ""
        raise ConfigError(f"{file}: not valid JSON: {exc}{hint}") from None


def _normalize(file: Path, data: dict[str, Any]) -> tuple[dict[str, Any], str, list[Finding]]:
    """Bastion's own format from either format, the key the servers were under, and what was noticed on the way.

    Clients' files (``mcpServers``, or VS Code's ``servers`` with ``type``) are read as those clients read them:
    see ``_client_entry``. A command or working directory given relative is read from the file's folder, in
    either format.
    """
    folder = file.resolve().parent
    key = _client_servers_key(file, data)
    if key is None:
        servers = data.get("servers")
        if isinstance(servers, dict):
            data = {**data, "servers": {name: _resolve_paths(entry, folder) if isinstance(entry, dict) else entry
                                        for name, entry in servers.items()}}
        return _expand_headers(file, data), "servers", []
    entries = data[key]
    if not isinstance(entries, dict):
        raise ConfigError(f"{file}: {key} must be an object mapping server names to entries")
    notes: list[Finding] = []
    ignored = sorted(k for k in data if k not in (key, "inputs") and k not in GatewayConfig.model_fields)
    if ignored:
        named = ", ".join(ignored[:5]) + (f" and {len(ignored) - 5} more" if len(ignored) > 5 else "")
        notes.append(Finding("warning", "(top level)", f"{named}: not Bastion settings, ignored",
                             "nothing to do; Bastion's own keys are listed in docs/configuration.md"))
    policy_off = "policy" in data and (data["policy"] is None or data["policy"] is False or data["policy"] == "off")
    variables = Variables.for_file(file)
    servers: dict[str, Any] = {}
    for name, entry in entries.items():
        where = f"{key}.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{file}: {where} must be an object with a command or a url")
        converted, found = _client_entry(where, entry, folder, variables, policy_off)
        notes.extend(found)
        if converted is not None and "url" in converted:
            servers[name] = converted  # remote: no process, so no sandbox grants to infer
        elif converted is not None and _inference_reads(converted):
            servers[name] = with_inferred_grants(name, converted, base_dir=str(folder),
                                                 memory_dir=paths.state_dir() / "memory")
        elif converted is not None:
            servers[name] = converted  # a key of the wrong type: validation names it, with the fix
    rest = {k: v for k, v in data.items() if k != key and k in GatewayConfig.model_fields}
    return {**rest, "servers": servers}, key, notes


def _inference_reads(entry: dict[str, Any]) -> bool:
    """Whether the keys grant inference reads have the types it reads them as (it runs before validation)."""
    return (isinstance(entry.get("command", ""), str) and isinstance(entry.get("args", []), list)
            and isinstance(entry.get("env", {}), dict) and isinstance(entry.get("cwd", ""), str)
            and isinstance(entry.get("sandbox"), (dict, str, type(None))))


def _client_servers_key(file: Path, data: dict[str, Any]) -> str | None:
    if "mcpServers" in data:
        return "mcpServers"
    servers = data.get("servers")
    if not isinstance(servers, dict):
        return None
    vscode = file.name == "mcp.json" and file.resolve().parent.name == ".vscode"
    if vscode or "inputs" in data or any(isinstance(v, dict) and "type" in v for v in servers.values()):
        return "servers"
    return None


def _client_entry(where: str, entry: dict[str, Any], folder: Path, variables: Variables,
                  policy_off: bool) -> tuple[dict[str, Any] | None, list[Finding]]:
    """One client entry as a Bastion server entry, or None (with an error finding) when it cannot be run as written.

    A server is left out, never half-read: the rest of the file still runs, and ``bastion check`` exits 2.
    """
    errors: list[Finding] = []
    notes: list[Finding] = []
    converted = {k: v for k, v in entry.items() if k not in _FOREIGN_ENTRY_KEYS and k not in _CLIENT_ENTRY_KEYS}
    if is_remote_entry(entry):
        converted = _remote_client_entry(converted, entry)
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        errors.append(Finding("error", f"{where}.disabled", f"{disabled!r} is not true or false, so the server is "
                              "left out (clients read any non-empty text as true)", "write true or false, no quotes"))
    elif disabled:
        # Left as written: a client does not expand a disabled server's variables either.
        return {**converted, "enabled": False}, []
    approved: list[str] = []
    for approve_key in ("autoApprove", "alwaysAllow"):
        if approve_key not in entry:
            continue
        tools = entry[approve_key]
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            errors.append(Finding("error", f"{where}.{approve_key}", "must be a list of tool names",
                                  'write the names as the server gives them, e.g. ["read_file"]'))
        elif policy_off and tools:
            notes.append(Finding("warning", f"{where}.{approve_key}", "ignored: the policy is off, so every call is "
                                 "allowed anyway", 'remove policy = "off" to have only these tools run unasked'))
        else:
            approved.extend(t for t in tools if t not in approved)
    if approved:
        converted["auto_approve"] = approved
    errors.extend(_expand_entry(where, converted, variables))
    env_file = entry.get("envFile")
    if env_file is not None:
        loaded = _read_env_file(f"{where}.envFile", env_file, folder, variables)
        if isinstance(loaded, Finding):
            errors.append(loaded)
        elif isinstance(converted.get("env", {}), dict):
            converted["env"] = {**loaded, **converted.get("env", {})}  # env given in the entry wins, as in VS Code
    if errors:
        return None, [*notes, *errors]
    return _absolute_arguments(_resolve_paths(converted, folder), folder), notes


def _absolute_arguments(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``./x`` in the arguments read from where the client runs the server (its ``cwd``, else the file's folder), as
    import writes them: the sandboxed server's working folder is ``/``, and the review and the sandbox's binds are
    decided for the file the client meant."""
    args, cwd = entry.get("args"), entry.get("cwd")
    if not isinstance(args, list):
        return entry  # the wrong type: validation names it, with the fix
    base = cwd if isinstance(cwd, str) and os.path.isabs(cwd) else str(folder)
    return {**entry, "args": [absolute_argument(arg, base) if isinstance(arg, str) else arg for arg in args]}


def _expand_entry(where: str, entry: dict[str, Any], variables: Variables) -> list[Finding]:
    """Expand the variables of command, args, env and cwd in place; a finding for each that cannot be."""
    errors: list[Finding] = []

    def expanded(key: str, text: Any) -> Any:
        if not isinstance(text, str):
            return text  # the wrong type is reported by validation, with the key
        try:
            return variables.expand(text)
        except VariableError as exc:
            errors.append(Finding("error", key, f"{exc}, so the server is left out", exc.fix))
            return text

    for key in ("command", "cwd", "url"):
        if key in entry:
            entry[key] = expanded(f"{where}.{key}", entry[key])
    if isinstance(entry.get("headers"), dict):
        entry["headers"] = {name: expanded(f"{where}.headers.{name}", value)
                            for name, value in entry["headers"].items()}
    if isinstance(entry.get("args"), list):
        entry["args"] = [expanded(f"{where}.args[{i}]", arg) for i, arg in enumerate(entry["args"])]
    if isinstance(entry.get("env"), dict):
        entry["env"] = {name: expanded(f"{where}.env.{name}", value) for name, value in entry["env"].items()}
    return errors


def is_remote_entry(entry: dict[str, Any]) -> bool:
    """A client entry for a server reached over HTTP: ``url`` (Claude, Cursor, VS Code), ``serverUrl`` (Windsurf)."""
    return "url" in entry or "serverUrl" in entry or entry.get("type") in _REMOTE_TYPES


def _remote_client_entry(converted: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """Bastion's form of a client's remote entry: its URL, headers, and the transport its ``type`` names."""
    remote = {k: v for k, v in converted.items() if k != "serverUrl"}
    if "url" not in remote and "serverUrl" in entry:
        remote["url"] = entry["serverUrl"]
    kind = entry.get("transportType", entry.get("type"))
    if kind == "sse":
        remote.setdefault("transport", "sse")
    elif kind in _REMOTE_TYPES:
        remote.setdefault("transport", "streamable-http")
    return remote


def _expand_headers(file: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Bastion's own file: the ``${env:NAME}`` (and other) references of each remote server's headers expanded,
    so a credential stays in the environment, not in the file; one that is not set is an error naming the key."""
    servers = data.get("servers")
    if not isinstance(servers, dict):
        return data
    variables = Variables.for_file(file)
    expanded_servers: dict[str, Any] = {}
    for name, entry in servers.items():
        headers = entry.get("headers") if isinstance(entry, dict) else None
        if isinstance(headers, dict):
            values = {}
            for header, value in headers.items():
                try:
                    values[header] = variables.expand(value) if isinstance(value, str) else value
                except VariableError as exc:
                    raise ConfigError(f"{file}: servers.{name}.headers.{header}: {exc} — fix: {exc.fix}",
                                      [Finding("error", f"servers.{name}.headers.{header}", str(exc), exc.fix)]) from None
            entry = {**entry, "headers": values}
        auth = entry.get("auth") if isinstance(entry, dict) else None
        if isinstance(auth, dict):
            entry = {**entry, "auth": _expand_auth(file, f"servers.{name}.auth", auth, variables)}
        expanded_servers[name] = entry
    return {**data, "servers": expanded_servers}


def _expand_state(file: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``[state]``: its password's ``${env:NAME}`` or ``${file:PATH}`` expanded (the error names the key and the
    variable, never a value) and its TLS files read from the configuration file's folder."""
    state = data.get("state")
    if not isinstance(state, dict):
        return data
    expanded = dict(state)
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        path = state.get(key)
        if isinstance(path, str) and path:
            path = os.path.expanduser(path)
            expanded[key] = path if os.path.isabs(path) else str(file.resolve().parent / path)
    for key in ("password", "username"):
        value = state.get(key)
        if isinstance(value, str):
            try:
                expanded[key] = Variables.for_file(file).expand(value)
            except VariableError as exc:
                raise ConfigError(f"{file}: state.{key}: {exc} — fix: {exc.fix}",
                                  [Finding("error", f"state.{key}", str(exc), exc.fix)]) from None
    return {**data, "state": expanded}


def _expand_auth(file: Path, where: str, auth: dict[str, Any], variables: Variables,
                 secrets: tuple[str, ...] = ("client_id", "client_secret")) -> dict[str, Any]:
    """A server's client id and secret (and its identity provider's, and the identity assertion) with their
    ``${file:PATH}`` or ``${env:NAME}`` expanded (the error names the key and the variable, never a value), and its
    ``ca_file`` and ``private_key_file`` read from the configuration file's folder."""
    expanded = dict(auth)
    for key in ("ca_file", "private_key_file"):
        path = auth.get(key)
        if isinstance(path, str) and path and not os.path.isabs(os.path.expanduser(path)):
            expanded[key] = str(file.parent / path)
        elif isinstance(path, str) and path:
            expanded[key] = os.path.expanduser(path)
    for key in secrets:
        value = auth.get(key)
        if isinstance(value, str):
            try:
                expanded[key] = variables.expand(value)
            except VariableError as exc:
                raise ConfigError(f"{file}: {where}.{key}: {exc} — fix: {exc.fix}",
                                  [Finding("error", f"{where}.{key}", str(exc), exc.fix)]) from None
    idp = auth.get("idp")
    if isinstance(idp, dict):
        expanded["idp"] = _expand_auth(file, f"{where}.idp", idp, variables,
                                       ("client_id", "client_secret", "subject_token"))
    return expanded


def _read_env_file(where: str, name: Any, folder: Path, variables: Variables) -> dict[str, str] | Finding:
    if not isinstance(name, str) or not name.strip():
        return Finding("error", where, "must be the path of a dotenv file", 'write e.g. "${workspaceFolder}/.env"')
    try:
        path = folder / Path(variables.expand(name)).expanduser()
    except VariableError as exc:
        return Finding("error", where, f"{exc}, so the server is left out", exc.fix)
    try:
        return read_dotenv(path)
    except FileNotFoundError:
        return Finding("error", where, f"{path} does not exist, so the server is left out",
                       "create it, or correct the path (relative paths are read from the configuration's folder)")
    except (OSError, UnicodeDecodeError) as exc:
        return Finding("error", where, f"{path} cannot be read ({exc}), so the server is left out",
                       "make it a readable UTF-8 text file")
    except ValueError as exc:
        return Finding("error", where, f"{path}: {exc}, so the server is left out",
                       "write one NAME=value per line (# starts a comment)")


def _resolve_paths(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A command with a slash in it, a working directory, a CA file and a client certificate and key, read from the
    configuration file's folder."""
    resolved = dict(entry)
    command = entry.get("command")
    if isinstance(command, str) and "/" in command and not os.path.isabs(command):
        resolved["command"] = str(folder / command)
    for key in ("cwd", "ca_file", "client_cert", "client_key"):
        value = entry.get(key)
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            resolved[key] = str(folder / value)
    return resolved


def _validation_findings(exc: ValidationError, servers_key: str, toml: bool = False) -> list[Finding]:
    findings = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        if loc and loc[0] == "servers":
            loc[0] = servers_key  # the key the user wrote
        kind = err["type"]
        if kind == "extra_forbidden":
            fix = "remove it, or check its spelling against docs/configuration.md"
        elif kind == "missing":
            fix = "add it"
        elif kind == PLAINTEXT_ERROR:
            fix = PLAINTEXT_FIX
        elif kind == NOT_ECHOED:
            fix = "as the message says"
        elif (written := _what_to_write(kind, loc, err.get("input"), err.get("ctx") or {}, toml)) is not None:
            fix = written
        elif isinstance(err.get("input"), (dict, list)):
            # A whole table is never echoed: it may hold a secret (an issuer's client_secret); the message says the fix.
            fix = "as the message says"
        else:
            fix = f"got {err.get('input')!r}"
        findings.append(Finding("error", ".".join(loc) or "(top level)", err["msg"], fix))
    return findings


_LIST_TYPES = ("list_type", "tuple_type", "set_type", "frozen_set_type")
_NUMBER_TYPES = ("int_type", "int_parsing", "int_from_float", "float_type", "float_parsing")
_BOOL_TYPES = ("bool_type", "bool_parsing")
_TABLE_TYPES = ("dict_type", "model_type", "model_attributes_type")


def _what_to_write(kind: str, loc: list[str], value: Any, ctx: Mapping[str, Any], toml: bool) -> str | None:
    """The fix of a value of the wrong type, as the line to write in the file's own syntax (None: no such line).
    A table or a list given is never echoed: it may hold a secret."""
    if not loc:
        return None
    item = loc[-1].isdigit() and len(loc) > 1  # an item of a list: named by the list, written as one of its items
    key = loc[-2] if item else loc[-1]

    def line(written: str) -> str:
        return f"write {key} = {written}" if toml else f'write "{key}": {written}'

    def scalar(text: Any) -> str | None:
        return None if isinstance(text, (dict, list)) else str(text)

    if kind in _LIST_TYPES:
        words = shlex.split(value) if isinstance(value, str) and _splits(value) else None
        example = json.dumps(words or (["first", "second"] if not isinstance(value, str) else [value]))
        return line(example) + " (a list, one item per element)"
    if kind == "string_type":
        text = scalar(value)
        quoted = json.dumps(text) if text is not None else '"..."'
        if item:
            return f"write each item of {key} as a string, quoted: {quoted}"
        return line(quoted) + " (a string, quoted)"
    if kind in _NUMBER_TYPES:
        number = value if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value) else None
        return line(number.strip() if number else "10") + " (a number, without quotes)"
    if kind in _BOOL_TYPES:
        return line("true") + " or false (without quotes)"
    if kind in _TABLE_TYPES:
        return (f"write [{'.'.join(loc)}] as a table of its settings (docs/configuration.md)" if toml else
                f'write "{key}": {{ ... }}, an object of its settings (docs/configuration.md)')
    if kind == "literal_error" and isinstance(ctx.get("expected"), str):
        return f"write one of {ctx['expected']} as {key}"
    return None


def _splits(text: str) -> bool:
    try:
        return bool(shlex.split(text))
    except ValueError:  # an unbalanced quote: the value is given back as one item
        return False


def _explain(file: Path, findings: list[Finding]) -> str:
    lines = [f"{file}: invalid configuration"]
    lines.extend(f"  {f.where}: {f.message} — fix: {f.fix}" for f in findings)
    return "\n".join(lines)


def state_dir() -> Path:
    return paths.state_dir()


def default_config() -> GatewayConfig:
    """Federate the reference servers the set-up installs, on scratch data, so a newcomer sees Bastion work."""
    scratch = state_dir() / "scratch"
    repo = scratch / "repo"
    files = scratch / "files"
    _prepare_scratch(repo, files)
    bindir = Path(sys.executable).parent
    servers: dict[str, ServerConfig] = {}
    time_server = _find_executable("mcp-server-time", bindir)
    if time_server:
        servers["time"] = ServerConfig(command=time_server, args=["--local-timezone", "UTC"], trust="trusted")
    git_server = _find_executable("mcp-server-git", bindir)
    if git_server:
        servers["git"] = ServerConfig(command=git_server, args=["--repository", str(repo)], trust="trusted",
                                      sandbox=SandboxConfig(writable=(str(repo),)))
    fs_server = _find_node_server("mcp-server-filesystem")
    if fs_server:
        servers["files"] = ServerConfig(command=fs_server, args=[str(files)], trust="trusted",
                                        sandbox=SandboxConfig(writable=(str(files),)))
    if not servers:
        log.warning("none of the default servers (mcp-server-time, mcp-server-git, mcp-server-filesystem) is "
                    "installed; run the set-up command from the README")
    # The reference servers are trusted for their annotations, so read-only tools run at once and anything that
    # writes waits in the approval queue (`bastion approvals`, `bastion approve ID`) unless the client can ask.
    return GatewayConfig(servers=servers, policy=default_policy())


def _find_node_server(name: str) -> str | None:
    """An npm server the set-up installed: in the checkout's node_modules (found from the package itself or from
    the virtual environment inside the checkout, never from the working directory), else on PATH."""
    for checkout in (Path(__file__).resolve().parent.parent, Path(sys.prefix).resolve().parent):
        candidate = checkout / "node_modules" / ".bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def _find_executable(name: str, preferred_dir: Path) -> str | None:
    candidate = preferred_dir / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def _prepare_scratch(repo: Path, files: Path) -> None:
    files.mkdir(parents=True, exist_ok=True)
    readme = files / "hello.txt"
    if not readme.exists():
        readme.write_text("Hello from Bastion's scratch folder.\n")
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        (repo / "README.md").write_text("# Scratch repository\n\nCreated by Bastion's default configuration.\n")
        import subprocess

        env = {**os.environ, "GIT_AUTHOR_NAME": "Bastion", "GIT_AUTHOR_EMAIL": "bastion@localhost",
               "GIT_COMMITTER_NAME": "Bastion", "GIT_COMMITTER_EMAIL": "bastion@localhost"}
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "README.md"],
                     ["git", "commit", "-q", "-m", "Initial commit"]):
            subprocess.run(argv, cwd=repo, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
