"""Traces (issue 25), through a real gateway process: the client's W3C trace context reaches the upstream on every road
(the plain one, the upload upgrade's lookup and upload, the card backfill's board and pages), each upstream request
with a span of its own; the access log names the trace and the gateway's span; with export on, the spans arrive at an
OTLP/HTTP receiver (decoded with the official protobuf messages) as one tree, sampled as configured, without a
secret, gzipped if asked, over TLS with the collector's authority and the gateway's client certificate; and a
collector that hangs or refuses costs no request anything: its spans are dropped and counted."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests import process_testlib
from tests.adversarial_upstream import AdversarialUpstream, Board, adversarial  # noqa: F401 - fixture
from tests.gateway_testlib import RecordingUpstream, bridged_routes, multipart_body
from tests.otlp_receiver import OtlpReceiver, Tls, otlp, tls_receiver  # noqa: F401 - fixtures
from tests.process_testlib import Proc, wait_for

B = "trace-boundary"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER}-01"
CLIENT = {"Host": "api.example.com", "Authorization": "Bearer road-token", "User-Agent": "legacy-app/1.0",
          "traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"}
_PARENT_RE = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])")


def _config(upstream: str, **tracing: Any) -> dict[str, Any]:
    return {
        "upstream": {"connect_timeout": 2, "read_timeout": 5},
        "tenants": [{"name": "acme", "hosts": ["api.example.com"], "upstream": upstream, "created": "2026-06-01",
                     "preserve_host": True, "bridges": {"upload_upgrade": True, "card_backfill": True}}],
        "rollout": {"now": "2026-11-24T12:00:00Z",
                    "exemptions": [{"name": "legacy", "phase": "full", "until": "2099-01-01",
                                    "header": {"name": "User-Agent", "prefix": "legacy-app/"}, "bridge": True}]},
        "routes": bridged_routes(),
        "tracing": tracing,
    }


def _export(receiver: OtlpReceiver, **options: Any) -> dict[str, Any]:
    return {"enabled": True, "endpoint": receiver.endpoint, "schedule_delay": 0.1, **options}


async def _send(proc: Proc, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as client:
        async with client.request(method, f"{proc.url}{path}", data=body, headers=headers) as resp:
            return resp.status, await resp.read()


async def _both_roads(proc: Proc, adversarial: AdversarialUpstream, **headers: str) -> None:  # noqa: F811
    """The plain road, the upload upgrade (card lookup and upload), the card backfill (the board, then its pages)."""
    adversarial.board("api.example.com", 5, Board(cards=120))
    status, _ = await _send(proc, "GET", "/api/v1/cards/7", **headers)
    assert status == 200
    put = multipart_body([(['Content-Disposition: form-data; name="file"; filename="a.txt"'], b"data")], B)
    status, answer = await _send(proc, "PUT", "/api/v1/cards/7/files", put,
                                 **{**headers, "Content-Type": f"multipart/form-data; boundary={B}"})
    assert status == 200, answer
    status, answer = await _send(proc, "GET", "/api/latest/boards/5", **headers)
    assert status == 200 and answer.count(b'"board_id": 5') == 120


def _parents(received: list[Any]) -> list[tuple[str, str, str]]:
    out = []
    for request in received:
        values = request.headers_all("traceparent")
        assert len(values) == 1, (request.method, request.raw_path, values)
        match = _PARENT_RE.fullmatch(values[0])
        assert match is not None, values[0]
        out.append((match[1], match[2], match[3]))
    return out


async def test_the_clients_trace_reaches_the_upstream_on_every_road_and_the_log_names_it(
    adversarial: AdversarialUpstream, tmp_path: Path  # noqa: F811
) -> None:
    proc = await process_testlib.start(_config(adversarial.url), tmp_path)
    try:
        await _both_roads(proc, adversarial, **CLIENT)
        roads = [(r.method, r.raw_path.split("?")[0]) for r in adversarial.received]
        assert roads[:4] == [("GET", "/api/v1/cards/7"), ("GET", "/api/v1/cards/7"),
                             ("POST", "/api/v1/cards/uid-api-7/files"), ("GET", "/api/latest/boards/5")]
        assert roads[4:] and all(road == ("GET", "/api/latest/cards") for road in roads[4:])
        parents = _parents(adversarial.received)
        # The client's trace and sampled flag on each; a parent of the gateway's own for each, never the caller's.
        assert {(trace, flags) for trace, _, flags in parents} == {(TRACE, "01")}
        spans = [span for _, span, _ in parents]
        assert len(set(spans)) == len(spans) and CALLER not in spans
        # The client's tracestate, members as received (optional whitespace left out).
        assert {r.header("tracestate") for r in adversarial.received} == {"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}
        # A request without a trace context starts one: the upstream and the log name the same trace.
        bare = {k: v for k, v in CLIENT.items() if k not in ("traceparent", "tracestate")}
        before = len(adversarial.received)
        assert (await _send(proc, "GET", "/api/v1/cards/8", **bare))[0] == 200
        ((new_trace, new_parent, new_flags),) = _parents(adversarial.received[before:])
        assert new_trace != TRACE and new_flags == "01" and adversarial.received[-1].header("tracestate") is None
        # An invalid one is ignored, its tracestate with it: a new trace.
        before = len(adversarial.received)
        broken = {**bare, "traceparent": TRACEPARENT.upper(), "tracestate": "congo=1"}
        assert (await _send(proc, "GET", "/api/v1/cards/9", **broken))[0] == 200
        ((other_trace, _, _),) = _parents(adversarial.received[before:])
        assert other_trace not in (TRACE, new_trace) and adversarial.received[-1].header("tracestate") is None

        async def logged() -> bool:
            return len(proc.access_lines()) >= 5

        await wait_for(logged)
        lines = proc.access_lines()
        assert [line["trace_id"] for line in lines] == [TRACE] * 3 + [new_trace, other_trace]
        ids = [line["span_id"] for line in lines]
        assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids) and len(set(ids)) == 5
        assert not set(ids) & {CALLER, *spans, new_parent}
    finally:
        proc.stop()


async def test_without_new_traces_only_a_clients_trace_is_carried(
    adversarial: AdversarialUpstream, tmp_path: Path  # noqa: F811
) -> None:
    proc = await process_testlib.start(_config(adversarial.url, new_traces=False), tmp_path)
    try:
        bare = {"Host": "api.example.com", "Authorization": "Bearer t", "traceparent": "00-zz", "tracestate": "a=1"}
        assert (await _send(proc, "GET", "/api/v1/cards/8", **bare))[0] == 200
        assert adversarial.received[-1].header("traceparent") is None
        assert adversarial.received[-1].header("tracestate") is None
        assert (await _send(proc, "GET", "/api/v1/cards/8", **CLIENT))[0] == 200
        ((trace, _, _),) = _parents(adversarial.received[-1:])
        assert trace == TRACE

        async def logged() -> bool:
            return len(proc.access_lines()) >= 2

        await wait_for(logged)
        assert [(line["trace_id"], line["span_id"] is None) for line in proc.access_lines()] == [
            (None, True), (TRACE, False)]
    finally:
        proc.stop()


async def test_exported_spans_form_one_tree_with_the_upstreams_parents(
    adversarial: AdversarialUpstream, otlp: OtlpReceiver, tmp_path: Path  # noqa: F811
) -> None:
    proc = await process_testlib.start(_config(adversarial.url, export=_export(otlp)), tmp_path)
    try:
        await _both_roads(proc, adversarial, **CLIENT)

        async def logged() -> bool:
            return len(proc.access_lines()) >= 3

        await wait_for(logged)
        upstream_parents = [span for _, span, _ in _parents(adversarial.received)]

        async def exported() -> bool:
            return len(otlp.of_trace(TRACE)) >= 3 + len(upstream_parents)

        await wait_for(exported, 10)
        assert otlp.content_types == {"application/x-protobuf"}
        spans = otlp.of_trace(TRACE)
        servers = [s for s in spans if s.kind == "server"]
        clients = [s for s in spans if s.kind == "client"]
        assert len(servers) == 3 and len(clients) == len(upstream_parents)
        # Each server span: a child of the client's span, and the span the access log names.
        assert {s.parent_span_id for s in servers} == {CALLER}
        assert [s.span_id for s in sorted(servers, key=lambda s: s.start_ns)] == [
            line["span_id"] for line in proc.access_lines()]
        assert {s.trace_state for s in servers} == {"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}
        # Each upstream request's parent is one client span, a child of its request's server span.
        by_id = {s.span_id: s for s in clients}
        assert sorted(upstream_parents) == sorted(by_id)
        server_ids = {s.span_id for s in servers}
        assert all(c.parent_span_id in server_ids for c in clients)
        plain, upload, board = sorted(servers, key=lambda s: s.start_ns)
        assert plain.name == "GET /api/v1/cards/{card_id}" and plain.attributes["http.route"] == "/api/v1/cards/{card_id}"
        assert plain.attributes.items() >= {
            "http.request.method": "GET", "http.response.status_code": 200, "url.path": "/api/v1/cards/7",
            "url.scheme": "http", "server.address": "api.example.com", "network.protocol.version": "1.1",
            "user_agent.original": "legacy-app/1.0", "gateway.tenant": "acme", "gateway.route": "card",
        }.items()
        assert upload.attributes["http.route"] == "/api/v1/cards/{card_id}/files"
        assert upload.attributes["gateway.decision.legacy_upload_guard"] == "upgraded"
        assert board.attributes["http.route"] == "/api/latest/boards/{board_id}"
        assert board.attributes["gateway.decision.board_cards"] == "full(exemption):backfilled"
        assert board.attributes["gateway.note.board_cards.backfill"].startswith("done cards=120")
        purposes: dict[str, list[Any]] = {s.span_id: [] for s in servers}
        for c in sorted(clients, key=lambda s: s.start_ns):
            purposes[c.parent_span_id].append(c.attributes.get("gateway.purpose"))
        assert purposes[plain.span_id] == [None]
        assert purposes[upload.span_id] == ["card_lookup", "upload"]
        assert purposes[board.span_id][0] is None and set(purposes[board.span_id][1:]) == {"backfill_page"}
        lookup = next(c for c in clients if c.attributes.get("gateway.purpose") == "card_lookup")
        assert lookup.name == "GET card_lookup" and lookup.attributes.items() >= {
            "http.request.method": "GET", "http.response.status_code": 200, "server.address": "127.0.0.1",
            "server.port": adversarial.port, "url.full": f"{adversarial.url}/api/v1/cards/7"}.items()
        assert all(c.start_ns >= parent.start_ns and c.end_ns <= parent.end_ns
                   for parent in servers for c in otlp.children(parent))
        resource = plain.resource
        assert resource["service.name"] == "deprecation-gateway" and resource["service.version"]
        values = await proc.metrics()
        assert values[("gateway_trace_spans_exported_total", ())] >= len(spans)
        assert values[("gateway_trace_spans_dropped_total", (("reason", "queue_full"),))] == 0
    finally:
        proc.stop()


async def test_the_ratio_sampler_follows_the_parent_and_samples_new_traces_by_their_id(
    upstream: RecordingUpstream, otlp: OtlpReceiver, tmp_path: Path
) -> None:
    data = process_testlib.config(upstream.url, 0, 0)
    data["tracing"] = {"sample_ratio": 0.5, "export": _export(otlp)}
    proc = await process_testlib.start(data, tmp_path)
    try:
        async with aiohttp.ClientSession() as client:
            for _ in range(40):
                async with client.get(f"{proc.url}/new") as resp:
                    assert resp.status == 200
            for flags in ("01", "00"):
                async with client.get(f"{proc.url}/child", headers={"traceparent": f"00-{TRACE}-{CALLER}-{flags}"}):
                    pass
        sent = _parents(upstream.received)
        new = sent[:40]
        marked = {trace for trace, _, flags in new if flags == "01"}
        assert 5 < len(marked) < 35  # about half (a binomial draw of 40: outside this once in 10^5 runs)
        assert all((int(trace[16:], 16) < 1 << 63) == (flags == "01") for trace, _, flags in new)
        assert [flags for _, _, flags in sent[40:]] == ["01", "00"]

        async def exported() -> bool:
            return len(otlp.spans) >= 2 * (len(marked) + 1)

        await wait_for(exported, 10)
        await asyncio.sleep(0.3)  # nothing more comes
        recorded = {s.trace_id for s in otlp.spans}
        # Recorded: exactly the new traces marked sampled, and the child of a sampled parent.
        assert recorded == marked | {TRACE} and len(otlp.spans) == 2 * len(recorded)
        assert {s.parent_span_id for s in otlp.of_trace(TRACE) if s.kind == "server"} == {CALLER}
    finally:
        proc.stop()


async def test_no_secret_reaches_a_span(upstream: RecordingUpstream, otlp: OtlpReceiver, tmp_path: Path) -> None:
    secrets = ["client-secret-token", "query-secret-signature", "upstream-secret-password", "cookie-secret-value",
               "gw-upstream-user"]
    url = upstream.url.replace("http://", "http://gw-upstream-user:upstream-secret-password@")
    data = process_testlib.config(url, 0, 0)
    data["routes"] = [{"name": "file", "methods": ["GET"], "paths": ["/files/{file_id}"]}]
    data["tracing"] = {"export": _export(otlp, headers={"x-collector-key": "${COLLECTOR_KEY}"})}
    env = {**os.environ, "COLLECTOR_KEY": "collector-secret-key"}
    proc = await process_testlib.start(data, tmp_path, env=env)
    try:
        headers = {"Authorization": "Bearer client-secret-token", "Cookie": "session=cookie-secret-value",
                   "X-Api-Key": "client-secret-token"}
        async with aiohttp.ClientSession() as client:
            async with client.get(f"{proc.url}/api/v1/files/42?signature=query-secret-signature&expires=9", headers=headers) as r:
                assert r.status == 200
            async with client.get(f"{proc.url}/api/v1/files/42?x=1", headers={"Authorization": "Basic Y2xpZW50LXNlY3JldC10b2tlbg=="}) as r:
                assert r.status == 200

        async def exported() -> bool:
            return len(otlp.spans) >= 4

        await wait_for(exported, 10)
        server = next(s for s in otlp.spans if s.kind == "server")
        client_span = next(s for s in otlp.spans if s.kind == "client")
        # What is there: the route, the path without its query, the client's fingerprint, the upstream's origin.
        assert server.attributes["http.route"] == "/api/v1/files/{file_id}"
        assert server.attributes["url.path"] == "/api/v1/files/42"
        assert re.fullmatch(r"[0-9a-f]{12}", server.attributes["gateway.client"])
        assert client_span.attributes["url.full"] == f"{upstream.url}/api/v1/files/42"
        for body in otlp.bodies:
            for secret in [*secrets, "Y2xpZW50LXNlY3JldC10b2tlbg", "signature=", "collector-secret-key"]:
                assert secret.encode() not in body, secret
        # The collector's own header went to the collector, and is shown nowhere else.
        config = await proc.get_json("/config")
        assert "collector-secret-key" not in str(config)
    finally:
        proc.stop()


async def test_a_collector_that_hangs_or_refuses_costs_requests_nothing_and_its_spans_are_counted(
    upstream: RecordingUpstream, otlp: OtlpReceiver, tmp_path: Path
) -> None:
    otlp.mode = "hang"
    closed = process_testlib.free_port()  # nothing listens there: every export is refused
    for name, endpoint in (("hang", otlp.endpoint), ("refuse", f"http://127.0.0.1:{closed}/v1/traces")):
        data = process_testlib.config(upstream.url, 0, 0)
        data["tracing"] = {"export": {"enabled": True, "endpoint": endpoint, "timeout": 2, "max_queue_size": 16,
                                      "max_batch_size": 4, "schedule_delay": 0.05}}
        proc = await process_testlib.start(data, tmp_path, name=name)
        try:
            slowest = 0.0
            async with aiohttp.ClientSession() as client:
                for i in range(60):
                    started = time.monotonic()
                    async with client.get(f"{proc.url}/r{i}") as resp:
                        assert resp.status == 200
                        await resp.read()
                    slowest = max(slowest, time.monotonic() - started)
            # No request waits for the export (a hung one would hold it for the export's 2 s timeout).
            assert slowest < 1.2, (name, slowest)

            async def counted() -> bool:
                values = await proc.metrics()
                return values[("gateway_trace_spans_dropped_total", (("reason", "export_failed"),))] > 0

            await wait_for(counted, 10)
            values = await proc.metrics()
            full = values[("gateway_trace_spans_dropped_total", (("reason", "queue_full"),))]
            failed = values[("gateway_trace_spans_dropped_total", (("reason", "export_failed"),))]
            assert values[("gateway_trace_spans_exported_total", ())] == 0
            # 120 spans (a server and a client span per request): a 16-span queue behind a dead collector drops most.
            assert full >= 40 and failed >= 1 and full + failed <= 120, (name, full, failed)
            assert not otlp.spans
            # It stops promptly, though its last export hangs (bounded: a few seconds).
            started = time.monotonic()
            proc.stop()
            assert proc.proc.returncode == 0 and time.monotonic() - started < 8
            # The collector's trouble is in the log, once, not once a batch.
            log = proc.log.read_text()
            assert log.count("opentelemetry.exporter") == 1, log
        finally:
            proc.stop()
    assert otlp.requests >= 1  # the hanging one was reached


async def _exports_of_one_request(proc: Proc, receiver: OtlpReceiver) -> bool:
    """A request through ``proc``; whether its spans reached ``receiver`` (False: the export failed, counted)."""
    before = len(receiver.spans)
    async with aiohttp.ClientSession() as client, client.get(f"{proc.url}/traced") as resp:
        assert resp.status == 200

    async def settled() -> bool:
        failed = (await proc.metrics()).get(("gateway_trace_spans_dropped_total", (("reason", "export_failed"),)), 0)
        return len(receiver.spans) > before or failed > 0

    await wait_for(settled, 10)
    return len(receiver.spans) > before


async def test_compression_gzip_gzips_every_export(upstream: RecordingUpstream, otlp: OtlpReceiver,  # noqa: F811
                                                   tmp_path: Path) -> None:
    for compression, encoding in (("gzip", "gzip"), ("none", "")):
        data = process_testlib.config(upstream.url, 0, 0)
        data["tracing"] = {"export": _export(otlp, compression=compression)}
        proc = await process_testlib.start(data, tmp_path, name=compression)
        try:
            otlp.encodings.clear()
            assert await _exports_of_one_request(proc, otlp)
            assert otlp.encodings and set(otlp.encodings) == {encoding}
        finally:
            proc.stop()


async def test_tls_to_the_collector_with_its_authority_and_a_client_certificate(
        upstream: RecordingUpstream, tls_receiver: tuple[OtlpReceiver, Tls], tmp_path: Path) -> None:  # noqa: F811
    """certificate_file: the collector's authority (not one the system trusts), also where the environment names
    another CA bundle for HTTP clients (REQUESTS_CA_BUNDLE, as many containers set); client_certificate_file and
    client_key_file: the certificate the collector asks the gateway for. Without either, no span arrives."""
    receiver, tls = tls_receiver
    env = {**os.environ, "REQUESTS_CA_BUNDLE": str(tls.server_cert), "CURL_CA_BUNDLE": str(tls.server_cert)}
    both = {"certificate_file": str(tls.ca), "client_certificate_file": str(tls.client_cert),
            "client_key_file": str(tls.client_key)}
    without_client = {"certificate_file": str(tls.ca)}
    without_authority = {"client_certificate_file": str(tls.client_cert), "client_key_file": str(tls.client_key)}
    for name, files, arrives in (("both", both, True), ("without_client", without_client, False),
                                 ("without_authority", without_authority, False)):
        data = process_testlib.config(upstream.url, 0, 0)
        data["tracing"] = {"export": _export(receiver, timeout=2, **files)}
        proc = await process_testlib.start(data, tmp_path, name=name, env=env)
        try:
            assert await _exports_of_one_request(proc, receiver) is arrives, name
        finally:
            proc.stop()
