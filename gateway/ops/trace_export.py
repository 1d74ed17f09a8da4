"""Spans recorded with the OpenTelemetry SDK and sent to a collector over OTLP/HTTP (``tracing.export``), imported only
when the export is on: a server span per request and a client span per upstream request, with the attributes
docs/operations.md ("Traces") lists and never a header value. Export never holds a request up: spans that do not fit
the queue, or that the collector does not take, are dropped and counted (``gateway_trace_spans_dropped_total``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web
import requests
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from .. import __version__
from ..config.tracing import TracingConfig
from ..core.exchange import Exchange
from ..core.http import random_bits
from ..core.tracecontext import ClientSpan, TraceContext, TraceParent, format_traceparent
from .metrics import Metrics

__all__ = ("SpanExport", "TraceFamilies")

log = logging.getLogger("gateway.tracing")

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
# At shutdown, how long what is still queued may take to leave (at most the export timeout).
_CLOSE_TIMEOUT = 5.0
# A recorded attribute's longest value (a User-Agent can be long); the SDK cuts longer ones.
_MAX_ATTRIBUTE_LENGTH = 1024
_DROP_REASONS = ("queue_full", "export_failed", "shutdown")
# The SDK's loggers that speak of every failed export (a collector down: a few lines a second, for as long as it is).
_EXPORT_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk._shared_internal")
_LOG_INTERVAL = 60.0


class _Sparse(logging.Filter):
    """At most one line a minute from the exporter: the metric counts every dropped span; the log says it started."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 0.0
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return False
        self._next = now + _LOG_INTERVAL
        if self._held:
            record.msg = f"{record.msg} (and {self._held} more trace export messages in the last minute)"
            self._held = 0
        return True


def _sparse_export_logs() -> None:
    for name in _EXPORT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Sparse) for f in logger.filters):
            logger.addFilter(_Sparse())


class TraceFamilies:
    """The export's own metric families (on the app's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.dropped = Counter(
            "gateway_trace_spans_dropped", "Spans recorded but not exported, by reason (queue_full: the export queue "
            "was full, the collector being slow or down; export_failed: the collector refused a batch or did not take "
            "it within tracing.export.timeout; shutdown: still queued when the gateway stopped).", ("reason",),
            registry=registry,
        )
        for reason in _DROP_REASONS:
            self.dropped.labels(reason)
        self.exported = Counter("gateway_trace_spans_exported", "Spans the collector accepted.", registry=registry)


def _method(method: str) -> str:
    return method if method in _METHODS else "_OTHER"


def _authority(host: str) -> tuple[str, int | None]:
    """A Host header's name (an IPv6 address without its brackets) and port."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = host.partition(":")
    return name, int(port) if port.isdigit() and len(port) <= 5 else None


class _Ids(IdGenerator):
    """The SDK's ids, from the gateway's random source. A root span takes the trace id the edge drew (and sampled
    by: ``Tracing.begin``), so that the SDK's ratio sampler decides on the same id."""

    def __init__(self) -> None:
        self.root: int | None = None

    def generate_trace_id(self) -> int:
        root, self.root = self.root, None
        return root if root is not None else random_bits(128) or 1

    def generate_span_id(self) -> int:
        return random_bits(64) or 1

    def is_trace_id_random(self) -> bool:
        return True


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it was given (``taken``: read by the admission), sent and dropped."""

    def __init__(self, exporter: SpanExporter, families: TraceFamilies) -> None:
        self._exporter = exporter
        self._exported = families.exported
        self._failed = families.dropped.labels("export_failed")
        # Spans handed to the exporter so far. Written only by the batch processor's exports (one at a time, under
        # its lock), read by the event loop's thread.
        self.taken = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
        try:
            result = self._exporter.export(spans)
        except Exception:
            log.warning("trace export failed", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._exported.inc(len(spans))
        else:
            self._failed.inc(len(spans))
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class _Admission(SpanProcessor):
    """Hands ended spans to the batch processor while its queue has room; otherwise drops the span and counts it.

    The queue holds what was handed and not yet taken by the exporter; ``handed`` is written by the event loop's
    thread only and ``taken`` by the exports only, so the difference never under-counts what is queued."""

    def __init__(self, batch: BatchSpanProcessor, exporter: _CountingExporter, capacity: int,
                 families: TraceFamilies) -> None:
        self._batch = batch
        self._exporter = exporter
        self._capacity = capacity
        self._full = families.dropped.labels("queue_full")
        self._after_shutdown = families.dropped.labels("shutdown")
        self.handed = 0
        self.closed = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return

    def on_end(self, span: ReadableSpan) -> None:
        if self.closed:
            self._after_shutdown.inc()
        elif self.handed - self._exporter.taken >= self._capacity:
            self._full.inc()
        else:
            self.handed += 1
            self._batch.on_end(span)

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._batch.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        left = self.handed - self._exporter.taken
        if left > 0:
            self._after_shutdown.inc(left)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)


class _RecordedClientSpan(ClientSpan):
    __slots__ = ("span",)

    def __init__(self, traceparent: str, tracestate: str, span: trace_api.Span) -> None:
        super().__init__(traceparent, tracestate)
        self.span = span

    def end(self, status: int | None = None, error: str | None = None, retries: int = 0) -> None:
        span = self.span
        attributes: dict[str, AttributeValue] = {}
        if status is not None:
            attributes["http.response.status_code"] = status
        if retries:
            attributes["http.request.resend_count"] = retries
        if error is not None or (status is not None and status >= 400):
            attributes["error.type"] = error or str(status)
            span.set_status(Status(StatusCode.ERROR))
        span.set_attributes(attributes)
        span.end()


class _RecordedTrace(TraceContext):
    """A sampled request's trace with its server span recorded; its upstream requests' spans are recorded too."""

    __slots__ = ("span", "_tracer", "_context")
    recording = True

    def __init__(self, span: trace_api.Span, tracer: trace_api.Tracer, parent_id: str | None,
                 tracestate: str) -> None:
        ids = span.get_span_context()
        super().__init__(f"{ids.trace_id:032x}", f"{ids.span_id:016x}", True, parent_id, tracestate)
        self.span = span
        self._tracer = tracer
        self._context: Context | None = None

    def client_span(self, method: str, target: str, purpose: str | None) -> ClientSpan:
        url = URL(target, encoded=True)
        context = self._context
        if context is None:
            context = self._context = trace_api.set_span_in_context(self.span, Context())
        attributes: dict[str, AttributeValue] = {
            "http.request.method": _method(method),
            "server.address": url.host or "",
            "url.full": str(url.origin()) + url.raw_path,
        }
        if url.port is not None:
            attributes["server.port"] = url.port
        if purpose is not None:
            attributes["gateway.purpose"] = purpose
        name = _method(method) if purpose is None else f"{_method(method)} {purpose}"
        span = self._tracer.start_span(name, context, SpanKind.CLIENT, attributes)
        ids = span.get_span_context()
        traceparent = format_traceparent(self.trace_id, f"{ids.span_id:016x}", bool(ids.trace_flags.sampled))
        return _RecordedClientSpan(traceparent, self.tracestate, span)


class _ConfiguredSession(requests.Session):
    """The exporter's HTTP session, whose CA file (``certificate_file``, set on the session by the exporter) is the
    one used: a plain session takes REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE from the environment over its own, so that in
    a container that sets one (many do) the collector's authority was silently not trusted."""

    def merge_environment_settings(self, url: str, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        settings: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if isinstance(self.verify, str):  # the exporter passes no verify of its own to a request
            settings["verify"] = self.verify
        return settings


class SpanExport:
    """The SDK's tracer provider (ratio sampler honouring the parent's decision), its batch processor and the OTLP/HTTP
    exporter, for one gateway process."""

    def __init__(self, config: TracingConfig, metrics: Metrics) -> None:
        export = config.export
        families = metrics.families(TraceFamilies)
        _sparse_export_logs()
        self._ids = _Ids()
        self.sampler = ParentBased(TraceIdRatioBased(config.sample_ratio))
        exporter = OTLPSpanExporter(
            session=_ConfiguredSession(),
            endpoint=export.endpoint,
            certificate_file=export.certificate_file,
            client_key_file=export.client_key_file,
            client_certificate_file=export.client_certificate_file,
            headers={name: value.get_secret_value() for name, value in export.headers.items()},
            timeout=export.timeout,
            compression=Compression.Gzip if export.compression == "gzip" else Compression.NoCompression,
        )
        self._exporter = _CountingExporter(exporter, families)
        batch = BatchSpanProcessor(self._exporter, max_queue_size=export.max_queue_size,
                                   schedule_delay_millis=export.schedule_delay * 1000,
                                   max_export_batch_size=export.max_batch_size)
        self._admission = _Admission(batch, self._exporter, export.max_queue_size, families)
        self._provider = TracerProvider(
            sampler=self.sampler,
            resource=Resource.create({"service.name": export.service_name, "service.version": __version__}),
            id_generator=self._ids,
            span_limits=SpanLimits(max_attribute_length=_MAX_ATTRIBUTE_LENGTH),
            shutdown_on_exit=False,  # ``close`` does it, bounded in time: never an exit held up by a collector
        )
        self._provider.add_span_processor(self._admission)
        self._tracer = self._provider.get_tracer("deprecation-gateway", __version__)
        self._close_timeout = min(_CLOSE_TIMEOUT, export.timeout)

    def begin(self, request: web.BaseRequest, trace_id: str, parent: TraceParent | None,
              tracestate: str) -> TraceContext:
        """A sampled request's server span, started now: a child of the client's span, or the root of ``trace_id``."""
        if parent is None:
            context = Context()
            self._ids.root = int(trace_id, 16)
        else:
            caller = SpanContext(int(trace_id, 16), int(parent.parent_id, 16), is_remote=True,
                                 trace_flags=TraceFlags(TraceFlags.SAMPLED),
                                 trace_state=TraceState.from_header([tracestate]) if tracestate else None)
            context = trace_api.set_span_in_context(NonRecordingSpan(caller), Context())
        attributes: dict[str, AttributeValue] = {
            "http.request.method": _method(request.method),
            "url.scheme": request.scheme,
            "network.protocol.version": f"{request.version.major}.{request.version.minor}",
        }
        address, port = _authority(request.headers.get("Host", ""))
        if address:
            attributes["server.address"] = address
        if port is not None:
            attributes["server.port"] = port
        agent = request.headers.get("User-Agent")
        if agent:
            attributes["user_agent.original"] = agent
        span = self._tracer.start_span(_method(request.method), context, SpanKind.SERVER, attributes,
                                       start_time=time.time_ns())
        self._ids.root = None
        if not span.is_recording():  # the SDK's sampler decided otherwise (it does not: same rule, same ratio)
            ids = span.get_span_context()
            return TraceContext(trace_id, f"{ids.span_id:016x}", bool(ids.trace_flags.sampled),
                                parent.parent_id if parent else None, tracestate)
        return _RecordedTrace(span, self._tracer, parent.parent_id if parent else None, tracestate)

    def end(self, trace: TraceContext, request: web.BaseRequest, exchange: Exchange | None, status: int,
            refused: str | None) -> None:
        if not isinstance(trace, _RecordedTrace):
            return
        span = trace.span
        attributes: dict[str, AttributeValue] = {"http.response.status_code": status}
        name = _method(request.method)
        error: str | None = None
        if refused is not None:
            attributes["gateway.refused"] = refused
        if exchange is not None:
            route = exchange.route
            template = route.template(exchange.path)
            if template is not None:
                attributes["http.route"] = template
                name = f"{name} {template}"
            attributes["url.path"] = exchange.path
            attributes["gateway.route"] = route.name
            attributes["gateway.tenant"] = exchange.tenant.name
            if exchange.method != request.method:
                attributes["gateway.effective_method"] = exchange.method
            if exchange.request_id is not None:
                attributes["gateway.request_id"] = exchange.request_id
            if exchange.client is not None:
                attributes["gateway.client"] = exchange.client
            for policy, decision in exchange.decisions.items():
                attributes[f"gateway.decision.{policy}"] = decision
            for key, note in exchange.notes.items():
                attributes[f"gateway.note.{key}"] = note
            if exchange.record.upstream_error:
                attributes["gateway.upstream_error"] = exchange.record.upstream_error
                error = exchange.record.upstream_error_kind
            if exchange.body_error:
                attributes["gateway.body_error"] = exchange.body_error
        if status >= 500:
            attributes["error.type"] = error or str(status)
            span.set_status(Status(StatusCode.ERROR))
        span.update_name(name)
        span.set_attributes(attributes)
        span.end()

    async def close(self) -> None:
        """Stop the export: what is queued is sent for at most a few seconds (on a thread of its own, so that a
        collector that hangs holds nothing up); what is left is counted as dropped."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def shutdown() -> None:
            try:
                self._provider.shutdown()
            except Exception:
                log.warning("trace export: shutdown failed", exc_info=True)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop may be closed by now
                    loop.call_soon_threadsafe(_settle, done)

        threading.Thread(target=shutdown, name="gateway-trace-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(asyncio.shield(done), self._close_timeout)
        except TimeoutError:
            log.warning("trace export: spans still queued after %.0fs at shutdown are dropped", self._close_timeout)


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
