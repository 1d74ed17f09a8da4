"""The ``tracing`` section of the config (``ops.tracing``): schema only."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from yarl import URL

__all__ = ("ExportConfig", "TracingConfig")

_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class ExportConfig(BaseModel):
    """``tracing.export``: spans recorded and sent to an OpenTelemetry collector over OTLP/HTTP (protobuf). Strict as
    the rest of the config (``gateway.config``): a value of the wrong YAML type is a problem, never coerced."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    enabled: bool = False
    # The collector's traces endpoint, path included (a collector's OTLP/HTTP receiver listens on 4318).
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    # Sent with every export (a vendor's API key): never shown (/config, check-config), better given as ${NAME}.
    headers: dict[str, SecretStr] = {}
    # One export request's time limit, retries included; the spans of a batch that fails are dropped (and counted).
    timeout: float = Field(default=10.0, gt=0, le=300)
    compression: Literal["none", "gzip"] = "none"
    # TLS to the collector: its CA bundle, and the gateway's client certificate and key (mTLS), as PEM files.
    certificate_file: str | None = None
    client_certificate_file: str | None = None
    client_key_file: str | None = None
    # The resource's service.name (OTEL_RESOURCE_ATTRIBUTES adds others, e.g. deployment.environment.name).
    service_name: str = Field(default="deprecation-gateway", min_length=1, max_length=255)
    # Spans waiting to be sent; over it a span is dropped (gateway_trace_spans_dropped_total{reason="queue_full"}).
    max_queue_size: int = Field(default=2048, ge=1, le=1_000_000)
    # Most spans in one export request, and the longest wait before a smaller batch is sent.
    max_batch_size: int = Field(default=512, ge=1, le=1_000_000)
    schedule_delay: float = Field(default=5.0, gt=0, le=300)

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        url = URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the endpoint must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        bad = [name for name in value if not _HEADER_NAME_RE.fullmatch(name)]
        if bad:
            raise ValueError(f"invalid header name(s) {bad!r}")
        if any(_breaks_line(v) for v in value.values()):
            raise ValueError("a header value may not contain a line break")
        return value

    @model_validator(mode="after")
    def _batch_fits(self) -> ExportConfig:
        if self.max_batch_size > self.max_queue_size:
            raise ValueError("max_batch_size may not exceed max_queue_size")
        if (self.client_certificate_file is None) != (self.client_key_file is None):
            raise ValueError("client_certificate_file and client_key_file go together")
        return self


class TracingConfig(BaseModel):
    """``tracing``: W3C trace context on every upstream request, the trace in the access log, and the export."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    # Start a trace for a request that comes without a (valid) traceparent; off: such a request carries none upstream.
    new_traces: bool = True
    # The share of the traces the gateway starts that are marked sampled (and, with export, recorded). A client's
    # own sampled flag is followed whatever this says.
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    export: ExportConfig = ExportConfig()


def _breaks_line(value: SecretStr) -> bool:
    secret = value.get_secret_value()
    return "\r" in secret or "\n" in secret
