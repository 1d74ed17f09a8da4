"""The status page's HTML, rendered here and only here from ``status.status_data`` (readable without JavaScript), and
refreshed in place every 10 seconds by a small inline script that fetches this renderer's main part (``render_main``,
served at ``status.main``): no build step, no external asset, no second renderer. Every value is escaped text, never
HTML."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from html import escape
from typing import Any

from .status_model import (
    Bar,
    BehaviourTimeline,
    Chart,
    ClientRow,
    Company,
    CompanyStates,
    ConfigState,
    ContactRow,
    Exemption,
    LedgerState,
    Marker,
    PolicyUsage,
    ReadinessSection,
    StatusData,
    Tick,
    Window,
)

__all__ = ("CONTENT_SECURITY_POLICY", "REFRESH_SECONDS", "render_main", "render_page")

REFRESH_SECONDS = 10


class _Html(str):
    """Markup already rendered (and escaped): inserted as it is."""


def _h(tag: str, attrs: Mapping[str, Any] | None = None, *children: Any) -> _Html:
    """An element: attribute values and text children are escaped; ``style`` is a dict of properties; an attribute
    that is None or False is left out (True: present, empty)."""
    parts = [f"<{tag}"]
    parts += [_attribute(name, value) for name, value in (attrs or {}).items() if value is not None and value is not False]
    parts.append(">")
    for child in children:
        parts.append(_child(child))
    if tag not in _VOID:
        parts.append(f"</{tag}>")
    return _Html("".join(parts))


def _attribute(name: str, value: Any) -> str:
    if value is True:
        return f" {name}"
    if name == "style":
        value = ";".join(f"{_css_name(k)}:{v}" for k, v in value.items())
    return f' {name}="{escape(str(value), quote=True)}"'


def _child(child: Any) -> str:
    if child is None or child is False:
        return ""
    if isinstance(child, _Html):
        return child
    if isinstance(child, (list, tuple)):
        return "".join(_child(c) for c in child)
    return escape(str(child), quote=False)


def _css_name(name: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name)


_VOID = frozenset({"meta", "br", "img", "input", "link"})


def _pct(value: float) -> str:
    return f"{value:g}%"


def _phase(name: str, severity: int | None, extra: str = "") -> _Html:
    return _h("span", {"class": f"phase s{severity}{extra}"}, name)


# --- the renderer: one function per part of the page, from the typed data (status_model) ---------------------


def _overview(data: StatusData) -> _Html:
    config = data["config"]
    now = data["now"]
    rows = [
        _h("dt", None, "Rollout clock"),
        _h("dd", None, _h("b", {"id": "now"}, now["label"]), " (fixed: rollout.now or GATEWAY_NOW)" if now["fixed"]
           else " (system clock)"),
        _h("dt", None, "Configuration"),
        _h("dd", None, _h("code", {"title": config["digest"]}, config["digest"][:19]), " from ",
           _h("code", None, config["source"]), f", loaded {config['loaded']} ",
           _h("span", {"class": "vol"}, f"({config['loaded_ago']})")),
        _h("dt", None, "Last reload"),
        _h("dd", {"id": "reload"}, _reload_text(config)),
        _h("dt", None, "Build"),
        _h("dd", None, f"gateway {data['build']['version']}"),
    ]
    rows += [_h("dt", None, "Usage ledger"), _h("dd", {"id": "ledger"}, _ledger(data["ledger"]))]
    rows += [_h("dt", None, "Page data"), _h("dd", {"class": "vol"}, f"at {data['generated']}")]
    return _h("section", {"id": "overview"}, _h("h2", None, "Gateway"), _h("dl", None, rows))


def _reload_text(config: ConfigState) -> list[Any]:
    """The last reload's outcome, and the count of reloads since start when there were any."""
    last = config["last_reload"]
    reloads = config["reloads"]
    if last is None:
        text: list[Any] = ["none since start"]
    elif last["result"] == "success":
        text = [_h("span", {"class": "ok"}, "succeeded"), f" at {last['at']} ",
                _h("span", {"class": "vol"}, f"({last['ago']})")]
    else:
        text = [_h("span", {"class": "bad"}, "refused"), f" at {last['at']} ", _h("span", {"class": "vol"},
                f"({last['ago']})"), f"; {last['problems']} problem(s), listed in the gateway's log; the previous "
                "configuration stays in force"]
    if reloads["success"] or reloads["failure"]:
        text.append(f" · since start: {reloads['success']} succeeded, {reloads['failure']} refused")
    return text


def _ledger(ledger: LedgerState | None) -> list[Any]:
    if ledger is None:
        return ["off (usage.ledger.enabled: false): no usage is recorded"]
    out = _ledger_state(ledger)
    out += [" to ", _h("code", None, ledger["database"]), f"; kept {ledger['retention_days']} days"]
    if ledger["dropped"]:
        out.append(_h("span", {"class": "bad"}, f"; {ledger['dropped']} request(s) could not be kept"))
    if ledger["refused"]:
        out.append(_h("span", {"class": "bad"}, f"; {ledger['refused']}"))
    if ledger["notice"]:
        out.append(_h("span", {"class": "bad"}, f"; {ledger['notice']}"))
    return out


def _ledger_state(ledger: LedgerState) -> list[Any]:
    """Failing since when and why, or writing (its state) and when it last wrote."""
    if ledger["state"] == "failing":
        return [_h("span", {"class": "bad"}, "failing"), f" since {ledger['since']} ",
                _h("span", {"class": "vol"}, f"({ledger['since_ago']})"),
                f": {ledger['error']}; {ledger['pending']} request(s) held in memory, retrying"]
    out: list[Any] = [_h("span", {"class": "ok"}, "writing") if ledger["state"] == "ok" else ledger["state"],
                      f" every {ledger['flush_interval']}"]
    if ledger["written"]:
        out += [", last ", _h("span", {"class": "vol"}, ledger["written"])]
    return out


def _tick(tick: Tick, i: int) -> _Html:
    # Shifted by its own position: a label at the axis' start begins there, one at its end ends there, so that no
    # label leaves the axis; ticks are far enough apart that labels never overlap (status._ticks).
    return _h("span", {"class": "tick" + (" minor" if i % 2 else ""),
                       "style": {"left": _pct(tick["pct"]), "transform": f"translateX(-{_pct(tick['pct'])})"}},
              tick["label"])


def _chart(chart: Chart | None, behaviour: BehaviourTimeline, now_pct: float, ticks: list[Tick]) -> list[_Html]:
    if chart is None:
        return [_h("p", {"class": "chartnote"}, "No recorded use in the usage ledger.")]
    grid = [_h("div", {"class": "grid", "style": {"left": _pct(t["pct"])}}) for t in ticks]
    bars = [_bar(b) for b in chart["bars"]]
    marks = [_h("div", {"class": f"cmark {m['kind']}", "title": m["label"], "style": {"left": _pct(m["pct"])}})
             for m in behaviour["markers"] if not m["far"]]
    return [_h("div", {"class": "chart", "aria-hidden": "true"}, grid, bars, marks,
               _h("div", {"class": "now", "title": "now", "style": {"left": _pct(now_pct)}})),
            _h("p", {"class": "chartnote"}, f"Requests per {chart['unit']} (UTC) from the usage ledger, "
               f"{chart['total']} in all, at most {chart['peak']} in one {chart['unit']}; "
               f"from {chart['first']} to {chart['last']}. The lines are the dated changes above.")]


def _marker(marker: Marker) -> _Html:
    """A dated change on the track; one off the axis is drawn at its edge."""
    return _h("div", {"class": f"marker {marker['kind']}" + (f" far {marker['far']}" if marker["far"] else ""),
                      "title": marker["label"], "style": {"left": _pct(marker["pct"])}})


def _bar(bar: Bar) -> _Html:
    return _h("div", {"class": "bar", "title": bar["label"],
                      "style": {"left": _pct(bar["from_pct"]), "width": _pct(bar["to_pct"] - bar["from_pct"]),
                                "height": _pct(bar["height_pct"])}})


def _timeline(behaviour: BehaviourTimeline, now_pct: float, ticks: list[Tick]) -> _Html:
    tick_marks = [_tick(t, i) for i, t in enumerate(ticks)]
    return _h("div", {"class": "timeline"},
              _h("div", {"class": "ticks", "aria-hidden": "true"}, tick_marks),
              _h("div", {"class": "track", "aria-hidden": "true"}, _track(behaviour, now_pct)),
              _lane(behaviour["brownouts"]), _edges(behaviour["markers"]),
              [_exemption(e) for e in behaviour["exemptions"]],
              _chart(behaviour["chart"], behaviour, now_pct, ticks))


def _track(behaviour: BehaviourTimeline, now_pct: float) -> list[_Html]:
    track = [_band(f"seg s{s['severity']}", s, s["phase"]) for s in behaviour["segments"]]
    track += [_band(f"brownout s{b['severity']} st-{b['state']}", b, b["label"]) for b in behaviour["brownouts"]]
    # A shadow is drawn hatched and light (nothing applied); a ramp as its share of the track's height.
    track += [_band(f"shadow s{w['severity']} st-{w['state']}", w, w["label"]) for w in behaviour["shadows"]]
    track += [_band(f"ramp s{r['severity']} st-{r['state']}", r, r["label"], r["share"]) for r in behaviour["ramps"]]
    track += [_marker(m) for m in behaviour["markers"]]
    track.append(_h("div", {"class": "now", "title": "now", "style": {"left": _pct(now_pct)}}))
    return track


def _band(cls: str, span: Mapping[str, Any], title: str, height: float | None = None) -> _Html:
    """A stretch of the track, from ``from_pct`` to ``to_pct``; ``height``: a share of the track's height."""
    style = {"left": _pct(span["from_pct"]), "width": _pct(span["to_pct"] - span["from_pct"])}
    if height is not None:
        style["height"] = _pct(height)
    return _h("div", {"class": cls, "title": title, "style": style})


def _edges(markers: list[Marker]) -> _Html | None:
    """Events off the axis: at its edge, with their date."""
    far = [m for m in markers if m["far"]]
    if not far:
        return None
    return _h("div", {"class": "edges"},
              _h("span", {"class": "edge before"},
                 "; ".join(f"◀ {m['name']} {m['date']}" for m in far if m["far"] == "before")),
              _h("span", {"class": "edge after"},
                 "; ".join(f"{m['name']} {m['date']} ▶" for m in far if m["far"] == "after")))


def _exemption(e: Exemption) -> _Html:
    return _h("div", {"class": f"exrow st-{e['state']}"},
              _h("div", {"class": "extrack"}, _h("span", {"class": "exbar" + (" far" if e["far"] else ""),
                                                          "style": {"width": _pct(e["to_pct"])}})),
              _h("span", {"class": "exlabel"}, f"exemption {e['name']} until {e['until']}" +
                 (" ▶" if e["far"] == "after" else "")))


def _lane(brownouts: list[Window]) -> _Html | None:
    """Brownouts last hours on a scale of months: a lane of their own, where each is at least a few pixels wide."""
    if not brownouts:
        return None
    return _h("div", {"class": "lane"}, [
        _h("div", {"class": f"bw s{b['severity']} st-{b['state']}", "title": b["label"], "style": {"left": _pct(b["from_pct"])}})
        for b in brownouts
    ])


_STATE_TEXT = {"past": "done", "now": "in force", "ahead": "ahead"}


def _behaviour(behaviour: BehaviourTimeline, now_pct: float, ticks: list[Tick]) -> _Html:
    upcoming = behaviour["next"]
    if upcoming is None:
        next_line = _h("p", {"class": "next"}, "No change scheduled.")
    else:
        next_line = _h("p", {"class": "next"}, "Next: ", _phase(upcoming["phase"], upcoming["severity"]),
                       f" at {upcoming['when']}, in {upcoming['in']}")
    events = _h("table", {"class": "events"},
                _h("thead", None, _h("tr", None, _h("th", None, "When"), _h("th", None, "What"),
                                     _h("th", None, "State"))),
                _h("tbody", None, [
                    _h("tr", {"class": f"st-{e['state']}"}, _h("td", {"class": "when"}, e["when"]),
                       _h("td", None, e["text"]), _h("td", None, _STATE_TEXT[e["state"]]))
                    for e in behaviour["events"]
                ]))
    return _h("div", {"class": "behaviour", "data-behaviour": behaviour["name"]},
              _h("h4", None, behaviour["name"], " ", _phase(behaviour["phase"], behaviour["severity"], " current"),
                 " ", _h("span", {"class": "kind"}, behaviour["kind"])),
              _h("p", {"class": "why"}, behaviour["why"]),
              next_line,
              _timeline(behaviour, now_pct, ticks),
              events)


def _tenant(tenant: Company, data: StatusData) -> _Html:
    timeline = data["timeline"]
    figures = None
    if tenant["usage"]:
        figures = _h("p", {"class": "figures"}, f"Requests {data['usage']['window']}: ", "; ".join(
            f"{u['behaviour']}: " + ", ".join(f"{d} {n}" for d, n in u["decisions"]) for u in tenant["usage"]))
    return _h("article", {"class": "tenant", "data-tenant": tenant["name"]},
              _h("h3", None, tenant["name"], " ",
                 _h("small", None, f"{tenant['timezone']} · local time {tenant['local_now']}")),
              figures,
              [_behaviour(b, timeline["now_pct"], timeline["ticks"]) for b in tenant["behaviours"]])


def _companies(data: StatusData) -> _Html:
    timeline = data["timeline"]
    return _h("section", {"id": "companies"},
              _h("h2", None, "Companies"),
              _h("p", {"class": "legend"}, f"Timelines from {timeline['start']} to {timeline['end']} (events "
                 "further away at the edges, with their dates); the blue line is now; hatched: brownout windows; "
                 "grey bars: exemptions; bars below: requests recorded in the usage ledger."),
              [_tenant(t, data) for t in data["tenants"]])


def _policy(policy: PolicyUsage) -> _Html:
    head = _h("tr", None, [_h("th", None, t) for t in ("Requests", "Client (token fingerprint)", "Tenant",
                                                       "User-Agent", "Decisions", "First seen (UTC)",
                                                       "Last seen (UTC)")])
    return _h("article", {"class": "policy", "data-policy": policy["name"]},
              _h("h3", None, policy["name"]),
              _h("p", None, _policy_summary(policy)),
              _h("div", {"class": "scroll"}, _h("table", {"class": "clients"}, _h("thead", None, head),
                                               _h("tbody", None, [_client_row(r) for r in policy["rows"]]))))


def _policy_summary(policy: PolicyUsage) -> str:
    summary = f"{policy['requests']} request{_s(policy['requests'])}: " + ", ".join(f"{d} {n}" for d, n in policy["by_decision"])
    summary += f"; {policy['clients']} client{_s(policy['clients'])}"
    if policy["variants"] != policy["clients"]:
        summary += f", {policy['variants']} User-Agent variant{_s(policy['variants'])}"
    if policy["untracked"]:
        summary += f"; {policy['untracked']} requests from clients over usage.max_clients (not listed)"
    if len(policy["rows"]) < policy["variants"]:
        summary += f"; the {len(policy['rows'])} most recently seen are listed (gateway usage --csv lists every one)"
    return summary


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _named_client(client: str | None, name: str | None) -> list[Any]:
    """A client's fingerprint, and the operator's name for it when there is one."""
    return [_h("code", None, client or "-"), [" ", _h("b", None, name)] if name else None]


def _client_row(r: ClientRow) -> _Html:
    return _h("tr", {"data-client": r["client"] or "", "class": "stopped" if r["stopped"] else None},
              _h("td", {"class": "num"}, str(r["requests"])),
              _h("td", None, _named_client(r["client"], r["name"])),
              _h("td", None, r["tenant"] or "-"),
              _h("td", {"class": "ua"}, r["user_agent"] or "-"),
              _h("td", None, r["decisions"]),
              _h("td", {"class": "when"}, r["first_seen"]),
              _h("td", {"class": "seen"}, r["last_seen"], " ", _h("span", {"class": "vol"}, f"({r['last_seen_ago']})")))


def _usage(data: StatusData) -> _Html:
    usage = data["usage"]
    body: Any = [_policy(p) for p in usage["policies"]] or _h(
        "p", None, "No request used deprecated behaviour in the window.")
    if usage["problem"]:
        body = _h("p", {"class": "bad"}, usage["problem"])
    return _h("section", {"id": "usage"},
              _h("h2", None, "Deprecated behaviour in use ", _h("small", None, usage["window"])),
              body)


def _who(c: ContactRow) -> list[Any]:
    """A client to contact: the operator's name beside its fingerprint, its User-Agent, its contact."""
    out: list[Any] = [_h("b", None, c["name"]), " "] if c["name"] else []
    out.append(_h("code", None, c["client"] or "-"))
    if c["internal"]:
        out.append(" (internal)")
    if c["user_agent"]:
        out += [_h("br"), _h("small", {"class": "ua"}, c["user_agent"])]
    out += [_h("br"), "contact: ", c["owner"] or "-"]
    return out


def _readiness(data: StatusData) -> _Html:
    r = data["readiness"]
    if r["problem"]:
        return _h("section", {"id": "readiness"}, _h("h2", None, "Clients to contact"), _h("p", {"class": "bad"}, r["problem"]))
    more = _h("p", None, f"... {r['more']} more: gateway outreach lists every one.") if r["more"] else None
    return _h("section", {"id": "readiness"}, _h("h2", None, "Clients to contact"), _h("p", None, _readiness_summary(r)),
              _h("div", {"class": "scroll"}, _state_counts(r["companies"])), _contacts(r["contacts"]), more)


def _readiness_summary(r: ReadinessSection) -> str:
    n, m = r["still_calling"], r["internal_clients"]
    return (f"{n} external client{_s(n)} still {'calls' if n == 1 else 'call'} deprecated behaviour"
            + (f"; {m} internal client{_s(m)} not counted" if m else "")
            + f". Ready: no deprecated call for {r['quiet_days']} days; read over the last {r['window_days']} days.")


def _state_counts(companies: list[CompanyStates]) -> _Html:
    return _h("table", {"class": "counts"},
              _h("thead", None, _h("tr", None, [_h("th", None, t) for t in ("Company", "Behaviour", "Blocked",
                                                                              "Overdue", "Calling", "Ready")])),
              _h("tbody", None, [
                  _h("tr", {"data-tenant": c["tenant"], "data-behaviour": c["behaviour"]},
                     _h("td", None, c["tenant"]), _h("td", None, c["behaviour"]),
                     [_h("td", {"class": "num"}, str(c[k])) for k in ("blocked", "overdue", "calling", "ready")])
                  for c in companies]))


def _contacts(contacts: list[ContactRow]) -> _Html:
    if not contacts:
        return _h("p", None, "No client calls deprecated behaviour any more.")
    head = _h("tr", None, [_h("th", None, t) for t in ("State", "Client", "Company", "Example call",
                                                       "What changes next", "Last call (UTC)")])
    return _h("div", {"class": "scroll"}, _h("table", {"class": "contacts"}, _h("thead", None, head),
                                             _h("tbody", None, [_contact(c) for c in contacts])))


def _contact(c: ContactRow) -> _Html:
    return _h("tr", {"class": f"state-{c['state']}", "data-client": c["client"] or "", "data-tenant": c["tenant"],
                     "data-behaviour": c["behaviour"]},
              _h("td", None, _h("span", {"class": f"state {c['state']}"}, c["state"])),
              _h("td", {"class": "who"}, _who(c)),
              _h("td", None, c["tenant"], _h("br"), c["behaviour"]),
              _h("td", None, _h("code", None, c["example"] or "-")),
              _h("td", None, c["next"], [_h("br"), _h("small", None, c["notes"])] if c["notes"] else None),
              _h("td", None, c["last_call"], " ", _h("span", {"class": "vol"}, f"({c['last_call_ago']})"), _h("br"),
                 _h("small", None, f"{c['recent']} ({c['trend']})")))


def _main(data: StatusData) -> list[_Html]:
    return [_overview(data), _readiness(data), _companies(data), _usage(data)]


# --- the page ---------------------------------------------------------------------------------------------------

_STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1d2125;--muted:#5c6670;--line:#d5dae0;--card:#f6f8fa;
--s0:#2e8b57;--s1:#c98a12;--s2:#c93c3c;--now:#1f6feb}
@media (prefers-color-scheme:dark){:root{--bg:#15181c;--fg:#e6e8ea;--muted:#9aa4ae;--line:#353c44;--card:#1d2126}}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;background:var(--bg);color:var(--fg)}
header,main,footer{max-width:1100px;margin:0 auto;padding:0 16px}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 16px}
h1{font-size:1.4rem;margin:16px 0 4px}
h2{font-size:1.15rem;border-bottom:1px solid var(--line);padding-bottom:4px;margin:24px 0 8px}
h3{font-size:1.05rem;margin:0 0 6px}h4{font-size:1rem;margin:12px 0 2px}
small,.kind,.legend,.why,footer,#note{color:var(--muted)}
.why,.next,.figures{margin:2px 0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}dt{font-weight:600}dd{margin:0;min-width:0}
code{font-size:.9em;overflow-wrap:anywhere}
.tenant,.policy{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px;margin:12px 0}
.phase{display:inline-block;padding:0 8px;border-radius:10px;color:#fff;font-weight:600;font-size:.85em}
.s0{background:var(--s0)}.s1{background:var(--s1)}.s2{background:var(--s2)}
.ok{color:var(--s0);font-weight:600}.bad{color:var(--s2);font-weight:600}
.timeline{margin:6px 0}
.ticks{position:relative;height:16px;font-size:11px;color:var(--muted)}
.tick{position:absolute;white-space:nowrap}
.track{position:relative;height:18px;border-radius:4px;overflow:hidden;background:var(--line)}
.seg{position:absolute;top:0;bottom:0;opacity:.8}
.brownout{position:absolute;top:0;bottom:0;min-width:4px;opacity:1;
background-image:repeating-linear-gradient(45deg,rgba(0,0,0,.45) 0 3px,transparent 3px 6px)}
.marker{position:absolute;top:0;bottom:0;width:2px;margin-left:-1px;background:var(--fg);opacity:.55}
.shadow{position:absolute;top:0;bottom:0;min-width:4px;opacity:.5;border:1px dashed var(--fg);box-sizing:border-box;
background-image:repeating-linear-gradient(-45deg,rgba(255,255,255,.7) 0 3px,transparent 3px 6px)}
.ramp{position:absolute;bottom:0;min-width:2px;opacity:.9;border-top:1px solid var(--fg)}
.marker.freeze{width:3px;background:var(--s2);opacity:.9}
.now{position:absolute;top:0;bottom:0;width:3px;margin-left:-1px;background:var(--now)}
.lane{position:relative;height:10px;margin-top:2px}
.bw{position:absolute;top:0;width:8px;height:10px;margin-left:-4px;border-radius:2px;
background-image:repeating-linear-gradient(45deg,rgba(0,0,0,.45) 0 2px,transparent 2px 4px)}
.bw.st-past{opacity:.45}
.marker.far{width:4px;margin-left:0;opacity:.8;background:repeating-linear-gradient(0deg,var(--fg) 0 3px,transparent 3px 5px)}
.marker.far.after{margin-left:-4px}
.edges{display:flex;flex-wrap:wrap;gap:0 12px;font-size:12px;color:var(--muted);margin-top:2px}
.edge.after{margin-left:auto;text-align:right}
.exrow{font-size:12px;color:var(--muted);margin-top:3px}
.extrack{position:relative;height:6px}
.exbar{display:block;height:6px;border-radius:3px;background:var(--muted);min-width:2px}
.exbar.far{border-radius:3px 0 0 3px}
.exlabel{display:block}
.exrow.st-past{opacity:.5}
.chart{position:relative;height:48px;margin-top:8px;border-bottom:1px solid var(--line)}
.bar{position:absolute;bottom:0;min-width:1px;background:var(--now);opacity:.6}
.grid{position:absolute;top:0;bottom:0;width:1px;background:var(--line)}
.cmark{position:absolute;top:0;bottom:0;width:0;border-left:2px dashed var(--fg);opacity:.45}
.chartnote{font-size:12px;color:var(--muted);margin:2px 0 0}
tr.stopped td{color:var(--muted)}
.state{display:inline-block;padding:0 6px;border-radius:8px;font-weight:600;font-size:.85em;color:#fff}
.state.blocked{background:var(--s2)}.state.overdue{background:var(--s1)}.state.calling{background:var(--now)}
.state.ready{background:var(--s0)}
table.counts{width:auto}table.counts td.num,table.counts th{padding:2px 10px}
table.contacts code{overflow-wrap:normal;word-break:normal}td.who{min-width:14em}td.who code{white-space:nowrap}
table{border-collapse:collapse;width:100%;font-size:.9em;margin-top:6px}
th,td{text-align:left;padding:3px 6px;border-bottom:1px solid var(--line);vertical-align:top}
tr.st-now td{font-weight:600}tr.st-past td{color:var(--muted)}
td.when{white-space:nowrap}td.num{text-align:right;white-space:nowrap}
.scroll{overflow-x:auto}.ua{overflow-wrap:anywhere;min-width:10em}
button{font:inherit;padding:2px 10px}
@media (max-width:640px){body{font-size:14px}.tick.minor{display:none}dl{grid-template-columns:1fr}
dd{margin-bottom:6px}td.when{white-space:normal}}
"""

# The one renderer is the Python above: the script only fetches the server's rendering of the page's main part
# (``render_main``, from the same data as /status.json) and puts it in place, keeping the page's query (?since=7d ...).
# Every value in that markup was escaped by ``_h``: User-Agent strings and contacts come from clients and stay text.
# The Content-Security-Policy allows only this script (by its hash) and requests to the page's own origin.
_SCRIPT = """
"use strict";
(() => {
  const main = document.getElementById("status");
  const note = document.getElementById("note");
  const button = document.getElementById("refresh");
  let busy = false;
  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const resp = await fetch("status.main" + location.search, {cache: "no-store", headers: {Accept: "text/html"}});
      if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
      main.innerHTML = await resp.text();
      main.dataset.refreshed = String((+main.dataset.refreshed || 0) + 1);
      note.textContent = "";
    } catch (err) {
      note.textContent = `Refresh failed (${err.message}); showing the last data.`;
    } finally {
      busy = false;
    }
  }
  button.hidden = false;
  button.addEventListener("click", refresh);
  setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
})();
""".replace("REFRESH_MS", str(REFRESH_SECONDS * 1000))


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


# Styles: the page's own <style> and the positions the server writes in style attributes ('unsafe-inline' is for
# those; nothing else on the page is inline markup from outside). Scripts: only the one above, by its hash.
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; script-src '{_sha256(_SCRIPT)}'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def render_main(data: StatusData) -> str:
    """The page's main part alone (what the script puts in place at each refresh), from ``status_data``'s dict."""
    return "".join(_main(data))


def render_page(data: StatusData) -> str:
    """The whole page, server-rendered from ``status_data``'s dict."""
    return "".join([
        "<!doctype html>\n",
        _h("html", {"lang": "en"},
           _h("head", None,
              _h("meta", {"charset": "utf-8"}),
              _h("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
              _h("meta", {"name": "referrer", "content": "no-referrer"}),
              _h("title", None, "Deprecation gateway: status"),
              _h("style", None, _Html(_STYLE))),
           _h("body", None,
              _h("header", None,
                 _h("h1", None, "Deprecation gateway"),
                 _h("button", {"id": "refresh", "type": "button", "hidden": True}, "Refresh"),
                 _h("span", {"id": "note", "role": "status"})),
              _h("main", {"id": "status"}, _main(data)),
              _h("footer", None, _h("p", None,
                 f"With JavaScript this page refreshes every {REFRESH_SECONDS} s in place; without it, "
                 "reload it. It shows what the admin endpoints /config, /rollout, /deprecations and /metrics serve.")),
              _h("script", None, _Html(_SCRIPT)))),
        "\n",
    ])
