"""``[state]``: where a gateway keeps what its replicas share. Absent: this process's memory (one gateway, no
replicas). The password's ``${env:NAME}``/``${file:PATH}`` and the TLS files' relative paths are resolved by the
configuration loader (bastion/config.py) before this validates them."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

DEFAULT_PREFIX = "bastion:"
DEFAULT_TIMEOUT = 2.0
DEFAULT_MAX_CONNECTIONS = 32
# The error type bastion/config.py reports without echoing the value (a url may carry a password).
_NOT_ECHOED = "not_echoed"


class StateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(description='the Redis every replica shares: "redis://HOST:PORT/DB", or "rediss://..." for TLS; '
                                 "no password in it (use password)")
    password: str | None = Field(default=None, description='Redis\'s password (AUTH); write "${env:NAME}" or '
                                                           '"${file:PATH}" to keep it out of the file')
    username: str | None = Field(default=None, description="a Redis ACL user name (absent: the default user)")
    tls_ca_file: str | None = Field(default=None, description="PEM file of the CA that signed Redis's certificate "
                                                              "(rediss:// only; absent: the system's CAs)")
    tls_cert_file: str | None = Field(default=None, description="PEM client certificate, when Redis asks for one "
                                                                "(rediss:// only; with tls_key_file)")
    tls_key_file: str | None = Field(default=None, description="the client certificate's PEM private key")
    key_prefix: str = Field(default=DEFAULT_PREFIX, min_length=1, max_length=200,
                            description="what every key and channel of this gateway starts with: gateways that "
                                        "share one Redis but not their state use different prefixes")
    timeout_seconds: float = Field(default=DEFAULT_TIMEOUT, gt=0, le=60,
                                   description="connect and answer timeout of every Redis operation: past it, "
                                               "what needs the state is refused as unreachable")
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=2, le=10_000,
                                 description="connections to Redis per gateway process, one of them for messages; "
                                             "more concurrent operations wait up to timeout_seconds for one")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise PydanticCustomError(_NOT_ECHOED, 'expected "redis://HOST:PORT/DB" or "rediss://HOST:PORT/DB"')
        if parts.password is not None or parts.username:
            # Refused, not warned: a url is shown in logs, process lists and error messages, and a configuration
            # file is committed and shared; a password belongs in password, read from the environment or a file.
            raise PydanticCustomError(
                _NOT_ECHOED, 'the url carries a password (or user): remove it from the url and write '
                             'password = "${env:REDIS_PASSWORD}" (or "${file:PATH}"), and username if needed')
        if parts.query or parts.fragment:
            raise PydanticCustomError(_NOT_ECHOED, "the url takes no ?options or #fragment: use the [state] keys")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise PydanticCustomError(_NOT_ECHOED, "the url's path is the database number, e.g. redis://HOST:6379/0")
        del port
        return value

    @model_validator(mode="after")
    def _tls_files(self) -> "StateConfig":
        given = [name for name in ("tls_ca_file", "tls_cert_file", "tls_key_file") if getattr(self, name)]
        if given and not self.url.startswith("rediss://"):
            raise ValueError(f"{', '.join(given)}: for TLS only; write the url as rediss://HOST:PORT/DB")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together: give both, or neither")
        return self

    @property
    def where(self) -> str:
        return describe(self.url)


def describe(url: str) -> str:
    """The store as people read it in messages: ``redis host:port/db``, never the password."""
    parts = urlsplit(url)
    db = (parts.path or "/0").lstrip("/") or "0"
    host = parts.hostname or "localhost"
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    return f"{parts.scheme or 'redis'} {host}:{port}/{db}"
