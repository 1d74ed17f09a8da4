"""The README's first command: ./scripts/demo.sh serves the sandbox through the gateway on the ports it is given, and
fails loudly (non-zero, with the log's end) when the gateway cannot start."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.gateway_testlib import free_port

ROOT = Path(__file__).resolve().parents[2]


def _ctrl_c_default() -> None:
    # A shell started with SIGINT ignored can never trap it (POSIX), and a test run started in the background by a
    # shell without job control ignores SIGINT and passes that on: the demo would then ignore the Ctrl-C this test
    # sends. A terminal's Ctrl-C reaches it with the default disposition; so does this test's.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_demo_serves_on_the_ports_it_is_given() -> None:
    port, admin, sandbox = free_port(), free_port(), free_port()
    proc = subprocess.Popen([str(ROOT / "scripts/demo.sh"), "--port", str(port), "--admin-port", str(admin),
                             "--sandbox-port", str(sandbox)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=_ctrl_c_default)
    # Everything the demo prints is read as it comes (its logs included): a pipe nobody reads would stop the gateway
    # at its next log line once full.
    output: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []

    def read_all() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.put(line)
        output.put(None)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = output.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            if "Ctrl-C stops both." in line:
                break
        assert any(f"http://127.0.0.1:{port} in front of the sandbox" in line for line in seen), "".join(seen)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/latest/boards/1",
                                         headers={"Authorization": "Bearer sandbox-token"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200 and resp.headers["Via"] == "1.1 deprecation-gateway"
            plain = json.loads(resp.read())
        # The sandbox plays the service after the withdrawal: no cards, except for the demo's bridged legacy client.
        assert "cards" not in plain and "cards_deprecation_message" in plain
        request = urllib.request.Request(request.full_url, headers={"Authorization": "Bearer sandbox-token",
                                                                    "User-Agent": "legacy-demo/1.0"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.headers["X-Gateway-Backfill"].startswith("done; cards=250;")
            assert len(json.loads(resp.read())["cards"]) == 250
        # The demo's legacy uploader: its refused upload is performed on the restricted route instead.
        boundary = "demo-boundary"
        content = b"uploaded through the bridge\n" * 100
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n"
                "Content-Type: text/plain\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
        for token, expected in (("Bearer legacy-uploader", 200), ("Bearer sandbox-token", 403)):
            upload = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/cards/1/files", data=body, method="PUT",
                                            headers={"Authorization": token,
                                                     "Content-Type": f"multipart/form-data; boundary={boundary}"})
            try:
                with urllib.request.urlopen(upload, timeout=10) as resp:
                    status, answer, headers = resp.status, json.loads(resp.read()), resp.headers
            except urllib.error.HTTPError as err:
                status, answer, headers = err.code, json.loads(err.read()), err.headers
            assert status == expected, answer
            if expected == 200:
                assert headers["X-Gateway-Upload-Upgrade"] == "upgraded; files=1"
                assert (answer["name"], answer["size"], answer["card_id"]) == ("notes.txt", len(content), 1)
                assert headers["Link"] == f'</api/v1/cards/{answer["card_uid"]}/files>; rel="successor-version"'
        assert headers["Deprecation"] and answer["code"] == "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=10) as resp:
            assert resp.status == 200
        # The admin token the demo made: printed with the status page's address, and taken by the admin listener.
        page = next(line.strip() for line in seen if f"127.0.0.1:{admin}/status?token=" in line)
        token = page.rpartition("token=")[2]
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{admin}/metrics", headers={"Authorization": f"Bearer {token}"}), timeout=10) as resp:
            assert resp.status == 200 and b"gateway_requests_total" in resp.read()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10)
            raise AssertionError("/metrics answered without the token")
        except urllib.error.HTTPError as err:
            assert err.code == 401
        _every_printed_command_shows_what_it_says(seen)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(40)  # the gateway finishes what is in flight (up to its shutdown_timeout of 30 s): none here
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for work in {m.group(1) for line in seen for m in [re.search(r"--config (\S*gateway-demo\.\w+)/", line)] if m}:
                shutil.rmtree(work, ignore_errors=True)  # the demo's clean-up, which SIGKILL skipped
            reader.join(5)
            rest = []
            while not output.empty():
                rest.append(output.get() or "")
            raise AssertionError("the demo did not stop within 40 s of Ctrl-C; what it printed last:\n"
                                 + "".join((seen + rest)[-60:])) from None


# What each command the demo prints must show (a piece of its command line -> what its output must contain). A
# printed command without an entry here fails the test: each one is there to show something.
SHOWS = {
    "boards/1 | grep -o": ['"cards_deprecation_message":"', "/api/latest/cards?board_id=1"],
    "cards?board_id=1&limit=2": ['"board_id":1'],
    "-A legacy-demo/1.0": ["HTTP/1.1 200", "X-Gateway-Backfill: done; cards=250"],
    "-H \"$T\" -X PUT": ["HTTP/1.1 403", "PUBLIC_API_LEGACY_FILE_UPLOAD_DISABLED"],
    "Bearer legacy-uploader": ["HTTP/1.1 200", "X-Gateway-Upload-Upgrade: upgraded; files=1"],
    "Host: legacy.localhost": ["HTTP/1.1 200", "Deprecation: @", '"name":"README.md"'],
    "%2e%2e": ['"path":"/api/v1/cards/1"'],
    "%2Ffiles": ["HTTP/1.1 400", '"code": "BAD_PATH"'],
    "/metrics": ["gateway_requests_total{"],
    "gateway usage": ["board_cards: ", "legacy_uploads: ", "legacy-demo/1.0"],
    "gateway rollout": ["tenant sandbox", "board_cards: ", "next change"],
    "gateway check-config": ["config/gateway.yaml: OK", "routes"],
}


def _every_printed_command_shows_what_it_says(printed: list[str]) -> None:
    lines = [line.rstrip("\n") for line in printed]
    block = lines[next(i for i, line in enumerate(lines) if line.startswith("Try")) + 1:]
    commands = [line.strip() for line in block if line.startswith("  ") and not line.startswith("  #")]
    assert commands[0].startswith("T='Authorization: Bearer sandbox-token'"), commands
    covered = set()
    for command in commands[1:]:
        keys = [key for key in SHOWS if key in command]
        assert len(keys) == 1, f"no single expectation for the demo's command {command!r}"
        covered.add(keys[0])
        # The ledger is written every second (the demo's flush_interval): its reader may run before the requests just
        # made are written, as a person typing it would not. It is asked again, for a few seconds at most.
        deadline = time.monotonic() + (10 if "gateway usage" in command else 0)
        while True:
            out = subprocess.run(["bash", "-c", f"{commands[0]}\n{command}"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0, (command, out.stderr)
            missing = [expected for expected in SHOWS[keys[0]] if expected not in out.stdout]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not missing, f"{command}\nprints:\n{out.stdout[:3000]}\nwithout {missing}"
    assert covered == set(SHOWS), set(SHOWS) - covered


def test_the_demo_fails_loudly_when_the_gateway_cannot_listen() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        out = subprocess.run([str(ROOT / "scripts/demo.sh"), "--port", str(port), "--admin-port", str(free_port()),
                              "--sandbox-port", str(free_port())], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    finally:
        taken.close()
    assert out.returncode == 1
    assert "demo: the gateway (exited) did not become ready" in out.stderr
    assert f"cannot listen: 127.0.0.1:{port}: address already in use" in out.stderr.lower()
