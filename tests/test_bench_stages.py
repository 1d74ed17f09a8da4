"""bench/stages.py puts a py-spy raw profile's samples in stages by their innermost frame."""

from __future__ import annotations

from tests.bench_testlib import load

stages = load("stages")

RAW = [
    "process 1:\"python\";run (asyncio/runners.py:118);_write_head (gateway/core/aiohttp_fast.py:340) 7\n",
    "process 1:\"python\";run (asyncio/runners.py:118) 5\n",
    "process 1:\"python\";run (asyncio/runners.py:118);Recorder.record (gateway/ops/access_log.py:140) 3\n",
    "process 1:\"python\";run (asyncio/runners.py:118);ProxyCore.send (gateway/proxy/core.py:200) 2\n",
    "process 1:\"python\";run (asyncio/runners.py:118);StreamWriter._writelines (aiohttp/http_writer.py:116) 4\n",
    "process 1:\"python\";run (asyncio/runners.py:118);StreamWriter.write_eof (aiohttp/http_writer.py:333) 1\n",
    "process 1:\"python\";something (elsewhere.py:1) 1\n",
    "garbage line without a count\n",
]


def test_samples_go_to_the_stage_of_their_innermost_frame() -> None:
    counts, total = stages.classify(RAW)
    assert total == 23
    assert counts["kernel: writes to the upstream and to the client"] == 11  # _write_head and _writelines
    assert counts["event loop (uvloop, C): epoll, reads, callbacks"] == 5
    assert counts["access log (ops/access_log.py, orjson)"] == 3
    assert counts["gateway proxy core (proxy/core.py)"] == 2
    assert counts["aiohttp server: request handler, request object, response head"] == 1  # write_eof is not write(2)
    assert counts[stages.OTHER] == 1
