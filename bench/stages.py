"""Where a request's time goes, per stage: a py-spy raw profile put in stages by its innermost frame's file.

    py-spy record -p GATEWAY_PID -r 400 -d 15 -f raw -o gw.raw --nonblocking   # while wrk -t1 -c50 drives it
    .venv/bin/python bench/stages.py gw.raw --cpu-us 101                        # µs = share × CPU per request

``--cpu-us`` is the CPU a request costs, from ``bench/run.py``'s report (its "CPU µs a request" column); without it
only the shares are printed. A sample goes to the first stage whose pattern matches the file of its innermost frame
(the kernel row: the frames that call ``transport.write``, where py-spy sees the time spent in ``write(2)``).
"""

from __future__ import annotations

import argparse
import collections
import re

_FRAME_FILE = re.compile(r".*\((.*?):\d+\)")

# (stage, pattern on the innermost frame's file, pattern on its function name or None)
STAGES: list[tuple[str, str, str | None]] = [
    ("kernel: writes to the upstream and to the client", r"aiohttp/http_writer\.py|gateway/core/aiohttp_fast\.py",
     r"^(StreamWriter\._write|StreamWriter\._writelines|_write_head) "),
    ("event loop (uvloop, C): epoll, reads, callbacks", r"asyncio/runners\.py", None),
    ("aiohttp server: request handler, request object, response head",
     r"aiohttp/(web_|http_writer|http_parser|base_protocol|helpers)", None),
    ("aiohttp client protocol: response parser, pool", r"aiohttp/(client|connector)", None),
    ("aiohttp streams (bodies)", r"aiohttp/streams\.py", None),
    ("gateway upstream client (proxy/upstream.py, core/aiohttp_fast.py)",
     r"gateway/(proxy/upstream|core/aiohttp_fast)\.py", None),
    ("gateway proxy core (proxy/core.py)", r"gateway/proxy/core\.py", None),
    ("gateway edge (edge/, core/exchange, core/http, core/tenants, chain)",
     r"gateway/(edge/|core/exchange|core/http|core/tenants|core/chain)", None),
    ("gateway server (server/listener.py, writer.py)", r"gateway/server/", None),
    ("access log (ops/access_log.py, orjson)", r"gateway/ops/access_log\.py", None),
    ("metrics (ops/metrics.py, prometheus_client)", r"gateway/ops/metrics\.py|prometheus_client", None),
    ("trace context (core/tracecontext.py, ops/tracing.py)", r"gateway/(core/tracecontext|ops/tracing)", None),
    ("policies (request_id)", r"gateway/policies/", None),
]
OTHER = "other (asyncio tasks, GC, the rest)"


def classify(raw_lines: list[str]) -> tuple[collections.Counter[str], int]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    compiled = [(name, re.compile(f), re.compile(fn) if fn else None) for name, f, fn in STAGES]
    for line in raw_lines:
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or not n.isdigit():
            continue
        samples = int(n)
        total += samples
        last = stack.split(";")[-1]
        file = _FRAME_FILE.sub(r"\1", last)
        for name, file_re, fn_re in compiled:
            if file_re.search(file) and (fn_re is None or fn_re.search(last)):
                counts[name] += samples
                break
        else:
            counts[OTHER] += samples
    return counts, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="py-spy record -f raw output")
    parser.add_argument("--cpu-us", type=float, default=None, help="CPU µs a request costs (bench/run.py)")
    args = parser.parse_args()
    with open(args.raw, encoding="utf-8") as handle:
        counts, total = classify(handle.readlines())
    if not total:
        raise SystemExit(f"{args.raw}: no samples")
    print("| stage | share | µs |" if args.cpu_us else "| stage | share |")
    print("|---|---:|---:|" if args.cpu_us else "|---|---:|")
    for name in [s[0] for s in STAGES] + [OTHER]:
        share = counts[name] / total
        cell = f" {args.cpu_us * share:.1f} |" if args.cpu_us else ""
        print(f"| {name} | {100 * share:.1f} % |{cell}")
    print(f"\n{total} samples")


if __name__ == "__main__":
    main()
