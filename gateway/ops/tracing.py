"""Traces: the gateway's part in its clients' traces, on every request (the client's W3C context read at the edge, a
span id of the gateway's own, the trace carried on by every upstream request and named in the access log: no SDK
object), and the spans it exports when ``tracing.export.enabled`` (``ops.trace_export``, sampled by
``ParentBased(TraceIdRatioBased(sample_ratio))``, the same decision taken here first). docs/operations.md, "Traces"."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from ..config.tracing import ExportConfig, TracingConfig
from ..core.exchange import Exchange
from ..core.tracecontext import (
    TRACEPARENT,
    TRACESTATE,
    TraceContext,
    TraceParent,
    continued_trace,
    new_trace,
    parse_traceparent,
    parse_tracestate,
)
from .metrics import Metrics

if TYPE_CHECKING:
    from .trace_export import SpanExport

__all__ = ("ExportConfig", "Tracing", "TracingConfig", "ratio_bound")

log = logging.getLogger("gateway.tracing")

def ratio_bound(ratio: float) -> int:
    """A trace id whose low 64 bits are below this is sampled: the rule of the SDK's ``TraceIdRatioBased``."""
    return round(ratio * (1 << 64))


class Tracing:
    """The edge's side of traces: ``begin`` when a request arrives, ``end`` when it has been recorded."""

    def __init__(self, config: TracingConfig, metrics: Metrics) -> None:
        self.config = config
        self._metrics = metrics
        self._new_traces = config.new_traces
        self._bound = None if config.sample_ratio >= 1.0 else ratio_bound(config.sample_ratio)
        self._export: SpanExport | None = None

    @property
    def exporting(self) -> bool:
        return self._export is not None

    def start(self) -> None:
        """With export on: the SDK's tracer, its batch processor (a thread) and the exporter."""
        if self.config.export.enabled and self._export is None:
            from .trace_export import SpanExport

            self._export = SpanExport(self.config, self._metrics)

    async def close(self) -> None:
        """Send what is still queued (bounded in time), then stop the export."""
        export, self._export = self._export, None
        if export is not None:
            await export.close()

    def begin(self, request: web.BaseRequest, *, parsed: bool = True) -> TraceContext | None:
        """The request's place in a trace: the client's continued (valid ``traceparent``), or a new one (unless
        ``new_traces`` is off: then None). With export, its server span starts now if the trace is sampled.
        ``parsed``: False for a request the HTTP parser rejected (its headers are not read)."""
        headers = request.headers
        parent = None
        if parsed and TRACEPARENT in headers:
            parent = parse_traceparent(headers.getall(TRACEPARENT))
        if parent is None:
            if not self._new_traces:
                return None
            trace = new_trace(self._bound)
            if self._export is not None and trace.sampled:
                return self._recorded(request, trace.trace_id, None, "") or trace
            return trace
        return self._continued(request, parent)

    def _continued(self, request: web.BaseRequest, parent: TraceParent) -> TraceContext:
        """The client's trace, continued; with export, its server span starts now if the client sampled it."""
        headers = request.headers
        tracestate = parse_tracestate(headers.getall(TRACESTATE, ())) if TRACESTATE in headers else ""
        if self._export is not None and parent.sampled:
            recorded = self._recorded(request, parent.trace_id, parent, tracestate)
            if recorded is not None:
                return recorded
        return continued_trace(parent, tracestate)

    def _recorded(self, request: web.BaseRequest, trace_id: str, parent: TraceParent | None,
                  tracestate: str) -> TraceContext | None:
        """The request's server span, recorded; None if the SDK failed (the request goes on, its trace unrecorded)."""
        assert self._export is not None
        try:
            return self._export.begin(request, trace_id, parent, tracestate)
        except Exception:
            log.exception("trace export: a span could not be started")
            return None

    def end(self, trace: TraceContext, request: web.BaseRequest, exchange: Exchange | None, status: int,
            refused: str | None = None) -> None:
        """The request was answered (``status``, as the access log records it): its server span ends."""
        export = self._export
        if export is not None:
            try:
                export.end(trace, request, exchange, status, refused)
            except Exception:
                log.exception("trace export: a span could not be ended")
