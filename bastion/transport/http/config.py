"""The ``http`` table of a configuration: how ``bastion serve --http`` listens, whom it trusts, and its bounds."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bastion.auth.config import AuthConfig

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
    max_in_flight_per_server: int = Field(
        default=64, ge=1, description="requests (tools/call, prompts/get, resources/read, ...) one server may have in "
                                  "flight from all clients together")
    retry_after_seconds: int = Field(default=1, ge=0, description="what a refusal for a full server tells the client")
    max_sessions: int = Field(default=10000, ge=1, description="open handshake-era sessions at most")
    session_idle_timeout: float = Field(default=3600.0, gt=0, description="seconds after which a quiet session ends")
    heartbeat_seconds: float = Field(default=15.0, gt=0, description="an SSE comment after this long without events")
    stream_buffer_messages: int = Field(
        default=1024, ge=8, description="messages one SSE stream may hold for a client that is not reading; past "
                                        "it the stream is closed")
    replay_events: int = Field(default=256, ge=0, description="events of a GET stream kept for Last-Event-ID")
    resume_seconds: float = Field(
        default=10.0, ge=0, description="how long a 2025-11-25 call whose answer stream dropped waits for its client "
                                        "to resume it with Last-Event-ID before it is cancelled; 0: answer streams "
                                        "are not resumable and a dropped one cancels its call at once")
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

