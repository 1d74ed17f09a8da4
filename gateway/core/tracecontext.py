"""W3C Trace Context (``traceparent``, ``tracestate``): reading a client's, and the one each upstream request carries
(the gateway takes part in the trace; what is invalid and how ``tracestate`` is cut: docs/operations.md, "Traces").
Pure functions and a small per-request object: no I/O, no SDK; ids are ``core.http.random_hex`` digits."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from multidict import istr

from .http import random_hex

__all__ = (
    "ClientSpan",
    "MAX_TRACESTATE",
    "TRACEPARENT",
    "TRACESTATE",
    "TraceContext",
    "TraceParent",
    "continued_trace",
    "format_traceparent",
    "new_trace",
    "new_span_id",
    "new_trace_id",
    "parse_traceparent",
    "parse_tracestate",
)

TRACEPARENT = istr("traceparent")
TRACESTATE = istr("tracestate")
# The most tracestate characters sent on (the specification asks for at least 512).
MAX_TRACESTATE = 512
_MAX_MEMBERS = 32
_LONG_MEMBER = 128

# version "-" trace-id "-" parent-id "-" flags, then (a version above 00 only) "-" and what that version adds.
_TRACEPARENT_RE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.DOTALL)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# key = simple-key / multi-tenant-key (Level 1, as its test suite checks it; the OpenTelemetry SDK reads the same).
# value = 0*255(chr) nblk-chr: printable ASCII but ',' and '=', not ending with a space.
_KEY = r"[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER_RE = re.compile(f"({_KEY})=(?:{_VALUE})")
_SAMPLED = frozenset("13579bdf")  # the second hex digit of the flags, when its lowest bit is set
_new_tuple = tuple.__new__
_OWS = " \t"


class TraceParent(NamedTuple):
    """A valid ``traceparent`` as the caller sent it."""

    trace_id: str  # 32 lower-case hex digits, not all zeros
    parent_id: str  # 16 lower-case hex digits, not all zeros: the caller's span
    sampled: bool


def parse_traceparent(values: Sequence[str]) -> TraceParent | None:
    """The caller's ``traceparent`` from every value the request carries of it; None when it is invalid (then a new
    trace is started, and ``tracestate`` is not read)."""
    if len(values) != 1:
        return None  # none, or given twice: which one would be the caller's?
    value = values[0]
    if len(value) != 55:
        value = value.strip(_OWS)
    match = _TRACEPARENT_RE.fullmatch(value)
    if match is None:
        return None
    version, trace_id, parent_id, flags, more = match.groups()
    if version == "ff" or (version == "00" and more is not None):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    # TraceParent(...) without the Python-level __new__ a NamedTuple has (half the cost of this function).
    return _new_tuple(TraceParent, (trace_id, parent_id, flags[1] in _SAMPLED))


def parse_tracestate(values: Sequence[str]) -> str:
    """The ``tracestate`` to send on, from every value of it the request carries (joined in order): its members as
    received, without optional whitespace, at most ``MAX_TRACESTATE`` characters; "" when there is none or it is
    invalid."""
    if len(values) == 1 and "," not in values[0]:  # one member: the common case
        member = values[0].strip(_OWS)
        return member if len(member) <= MAX_TRACESTATE and _MEMBER_RE.fullmatch(member) else ""
    members = _members(values)
    if members is None:
        return ""
    combined = ",".join(members)
    if len(combined) <= MAX_TRACESTATE:
        return combined
    return _truncated(members)


def _members(values: Sequence[str]) -> list[str] | None:
    """The list members of every value, in order, empty ones skipped; None when one is invalid, a key repeats, or
    there are too many."""
    members: list[str] = []
    keys: set[str] = set()
    for member in (item.strip(_OWS) for value in values for item in value.split(",")):
        if not member:
            continue
        match = _MEMBER_RE.fullmatch(member)
        if match is None or match[1] in keys:
            return None
        keys.add(match[1])
        members.append(member)
        if len(members) > _MAX_MEMBERS:
            return None
    return members


def _truncated(members: list[str]) -> str:
    """Whole members dropped until the rest fits: those over 128 characters first, then from the end."""
    kept = [m for m in members if len(m) <= _LONG_MEMBER]
    size = sum(len(m) for m in kept) + len(kept) - 1
    while kept and size > MAX_TRACESTATE:
        size -= len(kept.pop()) + 1
    return ",".join(kept)


def format_traceparent(trace_id: str, span_id: str, sampled: bool) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def new_trace_id() -> str:
    """128 random bits as 32 hex digits, never all zeros."""
    trace_id = random_hex(32)
    while trace_id == _ZERO_TRACE:
        trace_id = random_hex(32)
    return trace_id


def new_span_id() -> str:
    """64 random bits as 16 hex digits, never all zeros."""
    span_id = random_hex(16)
    while span_id == _ZERO_SPAN:
        span_id = random_hex(16)
    return span_id


def new_trace(bound: int | None = None) -> TraceContext:
    """A trace started by the gateway: its id, the gateway's span, and a span id drawn with them for the first upstream
    request (one draw of random bits per request, where most requests make one upstream request). Sampled
    when the trace id's low 64 bits are below ``bound`` (None: always; see ``ops.tracing.ratio_bound``)."""
    digits = random_hex(64)
    trace_id, span_id, spare = digits[:32], digits[32:48], digits[48:]
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN or spare == _ZERO_SPAN:
        trace_id, span_id, spare = new_trace_id(), new_span_id(), new_span_id()
    return TraceContext(trace_id, span_id, bound is None or int(trace_id[16:], 16) < bound, None, "", spare)


def continued_trace(parent: TraceParent, tracestate: str) -> TraceContext:
    """The client's trace, continued: a span of the gateway's own under the caller's (and one drawn with it for the
    first upstream request)."""
    digits = random_hex(32)
    span_id, spare = digits[:16], digits[16:]
    if span_id == _ZERO_SPAN or spare == _ZERO_SPAN:
        span_id, spare = new_span_id(), new_span_id()
    return TraceContext(parent.trace_id, span_id, parent.sampled, parent.parent_id, tracestate, spare)


class ClientSpan:
    """One upstream request's place in the trace: a span of the gateway's own, child of the request's (the edge's)
    span. ``traceparent`` is what the upstream is sent; ``end`` is called once, when the response head came or no
    response did. Recorded only when spans are exported (``ops.tracing``); otherwise its id is known only upstream.
    ``tracestate``: the client's, sent on with it ("" for none)."""

    __slots__ = ("traceparent", "tracestate")

    def __init__(self, traceparent: str, tracestate: str) -> None:
        self.traceparent = traceparent
        self.tracestate = tracestate

    def end(self, status: int | None = None, error: str | None = None, retries: int = 0) -> None:
        """``status``: the response head's; ``error``: why none came (connect, timeout, reset, busy, other);
        ``retries``: how many times the request was sent again."""


class TraceContext:
    """One request's place in a trace: the trace, the gateway's span for the request (what the access log names), the
    caller's span when the client sent a valid ``traceparent``, the sampled flag passed on, and the ``tracestate``."""

    __slots__ = ("trace_id", "span_id", "sampled", "parent_id", "tracestate", "_spare")
    recording = False  # its spans are recorded (exported): ``client_span`` makes each upstream request's

    def __init__(self, trace_id: str, span_id: str, sampled: bool, parent_id: str | None = None,
                 tracestate: str = "", spare: str = "") -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.sampled = sampled
        self.parent_id = parent_id
        self.tracestate = tracestate
        self._spare = spare  # a span id drawn ahead for the first upstream request ("" when none)

    def client_span(self, method: str, url: str, purpose: str | None) -> ClientSpan:
        """The span of one upstream request (``url``: where it goes, without its query; ``purpose``: a policy's own
        request's, None for the client's own)."""
        return ClientSpan(self.traceparent(), self.tracestate)

    def traceparent(self) -> str:
        """The ``traceparent`` of one upstream request, with a span id of its own: what there is of a span that is not
        recorded (the proxy core asks for it without a ``ClientSpan`` when ``recording`` is False)."""
        span_id = self._spare
        if span_id:
            self._spare = ""
        else:
            span_id = new_span_id()
        # format_traceparent, inline: this runs for every upstream request.
        return f"00-{self.trace_id}-{span_id}-{'01' if self.sampled else '00'}"
