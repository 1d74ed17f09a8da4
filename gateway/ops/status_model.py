"""The status page's data, typed: what ``status.status_data`` builds, ``/status.json`` serves as it is, and
``status_page`` renders (the one renderer). Plain dicts at run time (TypedDicts), so the JSON costs no conversion;
every time is already a label for people, every position a percentage of the page's one axis.

A timeline's parts are kept apart by what they draw: phases by date (``segments``), windows over them
(``brownouts``), instants (``markers``), per-client bars (``exemptions``); another kind of window or a share over
time is another list beside them."""

from __future__ import annotations

from typing import TypedDict

__all__ = (
    "Axis", "Bar", "BehaviourCensus", "BehaviourTimeline", "Chart", "ClientRow", "Company", "CompanyPage",
    "ConfigState", "Event", "Exemption", "LastReload", "LedgerState", "Marker", "NextChange", "NowState",
    "PhaseCount", "PolicyUsage", "Reloads", "Segment", "StatusData", "Tick", "UsageLine", "UsageSection", "Window",
)


class Tick(TypedDict):
    pct: float
    label: str


class Axis(TypedDict):
    """The one time axis of every timeline and chart of the page."""

    now_pct: float
    ticks: list[Tick]
    start: str
    end: str


class Segment(TypedDict):
    """A phase by the dates alone."""

    from_pct: float
    to_pct: float
    phase: str
    severity: int  # 0 (green), 1 (amber), 2 (red)


class Window(TypedDict):
    """A window in a later phase (a brownout)."""

    from_pct: float
    to_pct: float
    state: str  # past | now | ahead
    phase: str
    severity: int
    label: str


class Marker(TypedDict):
    """A dated instant on the axis; ``far``: before or after it, drawn at its edge."""

    pct: float
    kind: str  # signal | date
    far: str | None
    date: str
    name: str
    label: str


class Exemption(TypedDict):
    name: str
    client: str
    phase: str
    state: str  # now | past
    until: str
    to_pct: float
    far: str | None


class Event(TypedDict):
    """A row of a behaviour's table of dated events."""

    when: str
    kind: str  # base | signal | date | brownout | exemption
    state: str  # past | now | ahead
    phase: str | None
    severity: int | None
    text: str


# "in" is a keyword: the functional form.
NextChange = TypedDict("NextChange", {"phase": str, "severity": int, "at": str, "when": str, "in": str, "why": str})


class Bar(TypedDict):
    from_pct: float
    to_pct: float
    height_pct: float
    requests: int
    label: str


class Chart(TypedDict):
    """Requests per day, week or month from the usage ledger, on the page's axis."""

    unit: str
    peak: int
    total: int
    bars: list[Bar]
    first: str
    last: str


class BehaviourTimeline(TypedDict):
    """One dated behaviour of one company: its phase now and why, the next change, its timeline and its use."""

    name: str
    phases: list[str]
    phase: str
    severity: int
    kind: str
    why: str
    next: NextChange | None
    segments: list[Segment]
    brownouts: list[Window]
    markers: list[Marker]
    exemptions: list[Exemption]
    events: list[Event]
    chart: Chart | None


class UsageLine(TypedDict):
    behaviour: str
    decisions: list[tuple[str, int]]  # most requests first


class Company(TypedDict):
    name: str
    timezone: str
    local_now: str
    attention: list[str]  # why it needs attention, most pressing first; empty: nothing to do
    behaviours: list[BehaviourTimeline]
    usage: list[UsageLine]  # its requests in the window, per behaviour


class PhaseCount(TypedDict):
    phase: str
    severity: int
    companies: int
    filter: str  # the value of ?phase= that lists them


class BehaviourCensus(TypedDict):
    name: str
    phases: list[PhaseCount]


class CompanyPage(TypedDict):
    """Which companies the page shows: every company counted per phase, those that need attention first, the
    filter (``?company=`` a part of the name, ``?phase=behaviour:phase``) and the page (``?page=``)."""

    total: int
    attention: int  # companies that need attention (of every company)
    census: list[BehaviourCensus]
    company: str  # the filter on names, as given
    phase: str  # the filter on a phase, as given
    matching: int
    page: int
    pages: int
    first: int  # the position of the first company shown (1-based; 0: none)
    last: int


class NowState(TypedDict):
    iso: str
    label: str
    fixed: bool


class LastReload(TypedDict):
    result: str
    at: str
    ago: str
    problems: int


class Reloads(TypedDict):
    success: int
    failure: int


class ConfigState(TypedDict):
    source: str
    digest: str
    loaded: str
    loaded_ago: str
    last_reload: LastReload | None
    reloads: Reloads


class LedgerState(TypedDict):
    database: str
    state: str
    since: str
    since_ago: str
    error: str | None
    written: str
    pending: int
    dropped: int
    notice: str
    refused: str
    flush_interval: str
    retention_days: int


class ClientRow(TypedDict):
    client: str | None
    tenant: str | None
    user_agent: str | None
    requests: int
    decisions: str
    first_seen: str
    last_seen: str
    last_seen_ago: str
    stopped: bool


class PolicyUsage(TypedDict):
    name: str
    requests: int
    by_decision: list[tuple[str, int]]
    untracked: int
    clients: int
    variants: int
    rows: list[ClientRow]


class UsageSection(TypedDict):
    window: str
    problem: str | None
    policies: list[PolicyUsage]


class Build(TypedDict):
    version: str


class StatusData(TypedDict):
    generated_at: str
    generated: str
    now: NowState
    build: Build
    config: ConfigState
    ledger: LedgerState | None
    timeline: Axis
    companies: CompanyPage
    tenants: list[Company]  # the companies of this page, in order
    usage: UsageSection
