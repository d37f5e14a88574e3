"""A server's ``auth`` table: how Bastion authenticates to that upstream server."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class UpstreamAuth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["client_credentials", "token_exchange", "authorization_code"] = Field(
        description="client_credentials: Bastion's own token; token_exchange: a per-user token for the caller's "
                    "token (RFC 8693); authorization_code: a per-user token the user grants once through a link")
