"""The proxy core's options: the ``upstream`` section of the config (schema only; read by ``proxy.upstream``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ("UpstreamConfig",)


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    # Longest silence while waiting for the upstream's response head or its next body bytes.
    read_timeout: float = Field(default=60.0, gt=0, le=3600)
    pool_size: int = Field(default=1000, ge=1, le=100_000)
    keepalive_timeout: float = Field(default=30.0, gt=0, le=3600)
