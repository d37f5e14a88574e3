"""The ``[tracing]`` table: OpenTelemetry traces of the gateway's requests, exported over OTLP/HTTP.

Present, tracing is on; absent (the default), nothing of OpenTelemetry is even imported. Loading this table imports
nothing of OpenTelemetry either: ``bastion.observability.tracing`` does, when a gateway is built with it.
"""

from __future__ import annotations

import os
from typing import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

# The kind of a configuration error whose value is not written back in the message (it may hold a secret).
NOT_ECHOED = "not_echoed"


class TracingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp_endpoint: str | None = Field(
        default=None,
        description='where spans are sent, OTLP over HTTP: "http://HOST:PORT" (spans go to /v1/traces there) or a '
                    "full URL with its path; absent: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then "
                    "OTEL_EXPORTER_OTLP_ENDPOINT, then http://localhost:4318")
    service_name: str | None = Field(
        default=None, min_length=1, max_length=256,
        description='the service.name of every span; absent: OTEL_SERVICE_NAME, then "bastion"')
    sample_ratio: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="the share of traces recorded that no client's traceparent decided (0 to 1); a client's "
                    "sampled flag is followed")

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError:
            parts, port = None, None
        # A collector's OTLP/HTTP port is 4318, never http's 80: a plain http:// URL names its port. https:// may
        # leave it out (443, a vendor's endpoint).
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
                or (port is None and parts.scheme == "http") or parts.query or parts.fragment or parts.username \
                or parts.password:
            # Not echoed back (the error kind says so): a URL with a password in it is among what this refuses.
            raise PydanticCustomError(NOT_ECHOED, "expected http://HOST:PORT (or https://HOST[:PORT]), optionally with a path such as "
                             "/v1/traces, e.g. http://127.0.0.1:4318; no user, password or query in it (a "
                             "collector's credentials go in OTEL_EXPORTER_OTLP_HEADERS)")
        return value

    def traces_url(self) -> str | None:
        """The URL spans are posted to, or None to let the exporter read the OTEL_EXPORTER_OTLP_* variables."""
        if self.otlp_endpoint is None:
            return None
        path = urlsplit(self.otlp_endpoint).path
        return self.otlp_endpoint if path not in ("", "/") else self.otlp_endpoint.rstrip("/") + "/v1/traces"


def sdk_disabled(environ: Mapping[str, str] = os.environ) -> bool:
    """OTEL_SDK_DISABLED=true turns tracing off whatever the configuration says, as for every OpenTelemetry SDK
    (and then nothing of it is imported)."""
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
