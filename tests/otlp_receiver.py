"""A small OpenTelemetry collector for the tests: an OTLP/HTTP receiver (``POST /v1/traces``, protobuf) that decodes
what it is sent with the official ``opentelemetry-proto`` messages and keeps every span, and every body as it came
(for the tests that look for secrets in it). It can also be made to misbehave: ``hang`` (takes the request, never
answers) or ``fail`` (answers 503 to every export). ``tls_receiver`` serves it over TLS that asks for a client
certificate, with a certificate authority of its own made by ``openssl`` (``Tls``).
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

__all__ = ("ExportedSpan", "OtlpReceiver", "Tls", "otlp", "tls_receiver")

KINDS = {ProtoSpan.SPAN_KIND_SERVER: "server", ProtoSpan.SPAN_KIND_CLIENT: "client"}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


@dataclass
class ExportedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    trace_state: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int
    resource: dict[str, Any]
    scope: str


@dataclass
class OtlpReceiver:
    url: str = ""
    port: int = 0
    mode: str = "ok"  # ok | hang | fail
    bodies: list[bytes] = field(default_factory=list)  # as decoded from gzip, if it was
    spans: list[ExportedSpan] = field(default_factory=list)
    requests: int = 0
    content_types: set[str] = field(default_factory=set)
    encodings: list[str] = field(default_factory=list)  # each export's Content-Encoding ("" for none)
    _hanging: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.requests += 1
        if request.method != "POST" or request.path != "/v1/traces":
            return web.Response(status=404)
        body = await request.read()
        self.encodings.append(request.headers.get("Content-Encoding", ""))
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.content_types.add(request.headers.get("Content-Type", ""))
        if self.mode == "hang":
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._hanging.append(waiter)
            await waiter  # cancelled when the exporter gives up (or the test ends)
        if self.mode == "fail":
            return web.Response(status=503)
        self.bodies.append(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(ExportedSpan(
                        span.name, KINDS.get(span.kind, str(span.kind)), span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(), span.trace_state,
                        {a.key: _value(a.value) for a in span.attributes}, span.status.code,
                        span.start_time_unix_nano, span.end_time_unix_nano, resource, scope_spans.scope.name,
                    ))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def of_trace(self, trace_id: str) -> list[ExportedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def children(self, span: ExportedSpan) -> Iterator[ExportedSpan]:
        return (s for s in self.spans if s.parent_span_id == span.span_id)


@pytest.fixture
async def otlp(aiohttp_raw_server: Any) -> OtlpReceiver:
    receiver = OtlpReceiver()
    server = await aiohttp_raw_server(receiver.handle, auto_decompress=False)  # a gzipped export is gunzipped here
    receiver.port = server.port
    receiver.url = f"http://127.0.0.1:{server.port}"
    return receiver


@dataclass(frozen=True)
class Tls:
    """PEM files of a certificate authority, a server certificate for 127.0.0.1 and a client certificate it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, directory: Path) -> Tls:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.fail("these tests need the openssl command (Debian's openssl package)")

        def run(*args: str) -> None:
            subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True, timeout=30)

        key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=test ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
        for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
            run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
            (directory / f"{name}.ext").write_text(f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n")
            run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
        return cls(directory / "ca.pem", directory / "server.pem", directory / "server.key", directory / "client.pem",
                   directory / "client.key")


@pytest.fixture
async def tls_receiver(tmp_path: Path) -> AsyncIterator[tuple[OtlpReceiver, Tls]]:
    """An OTLP receiver on https://127.0.0.1 whose TLS wants a client certificate signed by its authority."""
    tls = Tls.make(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca))
    context.load_cert_chain(tls.server_cert, tls.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    receiver = OtlpReceiver()
    runner = web.ServerRunner(web.Server(receiver.handle, auto_decompress=False))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    receiver.port = runner.addresses[0][1]
    receiver.url = f"https://127.0.0.1:{receiver.port}"
    yield receiver, tls
    await runner.cleanup()
