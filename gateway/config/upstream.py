"""The proxy core's options: the ``upstream`` section of the config (schema only; read by ``proxy.upstream``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ("UpstreamConfig",)


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    # Longest silence while waiting for the upstream's response head or its next body bytes.
    read_timeout: float = Field(default=60.0, gt=0, le=3600)
    pool_size: int = Field(default=1000, ge=1, le=100_000)
    # Idle pooled connections are closed after this. Keep it below the upstream's own idle timeout (Node 5 s, Apache
    # 5 s, nginx 75 s; gunicorn 2 s), so that the gateway, not the upstream, closes an idle connection: an upstream
    # that closes one as the gateway reuses it makes the request fail (see retry_safe_methods).
    keepalive_timeout: float = Field(default=4.0, gt=0, le=3600)
    # A GET, HEAD, OPTIONS or TRACE without a body whose pooled connection broke before the response head is sent once
    # more on a new connection (a request that certainly never left the gateway is always sent again; see the docs).
    retry_safe_methods: bool = True
    # Most requests of one tenant in flight to its upstream at once (0: only pool_size bounds them); a request over it
    # waits up to queue_timeout for a turn, then gets 503 UPSTREAM_BUSY with Retry-After.
    max_concurrent_per_tenant: int = Field(default=0, ge=0, le=100_000)
    queue_timeout: float = Field(default=1.0, ge=0, le=300)
