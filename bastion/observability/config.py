"""The ``[metrics]`` table: whether the gateway keeps metrics, where an extra listener serves them, and how callers
are labelled."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as (host, port); ValueError says what is wrong and the fix."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT; write e.g. \"127.0.0.1:9464\" or \"[::1]:9464\"")
    return host.strip("[]"), int(port)


class MetricsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="keep metrics and serve /metrics; false: no metrics at all, "
                                                    "and no cost per call")
    listen: str | None = Field(
        default=None, description="HOST:PORT of a separate listener serving /metrics, /healthz and /readyz without "
                                  "authentication (keep it on loopback or a private network); absent: none. The only "
                                  "way to read metrics of `bastion run` on stdio")
    identity_labels: Literal["class", "name"] = Field(
        default="class", description="how callers are labelled: 'class' (how they authenticated: configured, header, "
                                     "oauth, api_key, mtls) or 'name' (each identity's name; more series)")

    @field_validator("listen")
    @classmethod
    def _listen_is_an_address(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_listen(value)
            except ValueError as error:
                raise PydanticCustomError("listen", "{problem}", {"problem": str(error)}) from None
        return value

    @model_validator(mode="after")
    def _listen_needs_metrics(self) -> "MetricsConfig":
        if self.listen is not None and not self.enabled:
            raise PydanticCustomError("listen", "listen is set but enabled is false: there would be no metrics to "
                                                "serve; remove listen, or set enabled = true")
        return self

    @property
    def address(self) -> tuple[str, int] | None:
        return parse_listen(self.listen) if self.listen is not None else None
