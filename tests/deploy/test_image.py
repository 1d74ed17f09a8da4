"""deploy/Dockerfile, built and run with podman: the image the operators run, not a reading of its text.

The base is a Python image made from Debian's archive by deploy/python-base-image.sh (no container registry is
needed; made once, then cached in podman's image store), passed as the Dockerfile's PYTHON_IMAGE. The container then
has to start, answer /livez and /readyz, pass its own HEALTHCHECK, run as uid 10001 on a read-only root filesystem,
have the C scanner, proxy to an upstream on the host (byte for byte, and the board policy at work), and drain on
SIGTERM within the grace period.

The containers run on the host's network (--network host): the gateway listens on free loopback ports (--listen, and
GATEWAY_ADMIN_LISTEN, which the image's health check follows) and the upstream on 127.0.0.1. No container network is
needed (podman's bridge exists only while a container is attached to it), and every request stays on loopback.

Skipped, saying why, only where podman cannot run: not Linux, not root (rootful podman and mmdebstrap), podman not
installed (scripts/test.sh installs Debian's podman, runc and mmdebstrap when it runs as root), or `podman info`
failing. A failure to make the base or to build the image fails.

podman reads a containers.conf of the test's own (CONTAINERS_CONF), so a fresh clone works the same on any machine:
the runtime is runc (crun refuses cgroup v1), and the containers' rlimits are the host's own hard limits (podman's
default raises nofile to 1048576, which needs CAP_SYS_RESOURCE, missing in some virtual machines).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from .deploy_testlib import DOCKERFILE, ROOT

BASE_SCRIPT = ROOT / "deploy" / "python-base-image.sh"
IMAGE = "localhost/deprecation-gateway:test"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The gateway's drain in the test's config, and the grace period `podman stop` gives (Kubernetes' is 45 s with 5 s of
# preStop: docs/deployment.md); a container still running at the end of it is killed (exit 137).
DRAIN_DELAY = 2.0
ADMIN_TOKEN = "image-test-admin-token-0123456789"  # /metrics is closed without it
SHUTDOWN_TIMEOUT = 10.0
GRACE = 20


def _why_podman_cannot_run() -> str | None:
    if not sys.platform.startswith("linux"):
        return "podman runs Linux containers: not on this platform"
    if os.geteuid() != 0:
        return "needs root (rootful podman, and mmdebstrap to make the base image)"
    if shutil.which("podman") is None:
        return ("podman is not installed (scripts/test.sh installs Debian's podman, runc and mmdebstrap with apt-get "
                "when it runs as root)")
    return None


@dataclass
class Podman:
    env: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and out.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {out.returncode}\n{out.stdout[-3000:]}"
                                 f"\n{out.stderr[-3000:]}")
        return out

    def inspect(self, name: str, template: str) -> str:
        return self.run("inspect", "--format", template, name).stdout.strip()


def _hard_limit(which: int, most: int) -> int:
    hard = resource.getrlimit(which)[1]
    return most if hard == resource.RLIM_INFINITY else min(hard, most)


def _report(config: pytest.Config, line: str) -> None:
    """A figure on the terminal (the run's log in CI), with or without -s."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\ntests/deploy/test_image.py: {line}")


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    why = _why_podman_cannot_run()
    if why is not None:
        pytest.skip(why)
    # The test's own containers.conf: runc, and limits the host can grant (its own hard limits; for processes, no more
    # than the kernel's pid_max either: runc was refused above it on a machine whose hard limit was higher).
    nofile = _hard_limit(resource.RLIMIT_NOFILE, 1 << 20)
    nproc = min(_hard_limit(resource.RLIMIT_NPROC, 1 << 20), int(Path("/proc/sys/kernel/pid_max").read_text()))
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    tool = Podman({**os.environ, "CONTAINERS_CONF": str(conf)})
    info = tool.run("info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.CgroupsVersion}}", check=False)
    if info.returncode != 0:
        pytest.skip(f"podman cannot run here: `podman info` says {info.stderr.strip()[-500:]}")
    return tool


@pytest.fixture(scope="module")
def image(podman: Podman, request: pytest.FixtureRequest) -> str:
    """The gateway's image, built from deploy/Dockerfile on the Debian-archive base."""
    started = time.monotonic()
    base = subprocess.run([str(BASE_SCRIPT)], capture_output=True, text=True, timeout=900, env=podman.env)
    assert base.returncode == 0, f"deploy/python-base-image.sh failed:\n{base.stderr[-4000:]}"
    podman.timings["base"] = time.monotonic() - started
    made = "making" in base.stderr
    previous = podman.run("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    # The build's RUN steps on the host's network too (apt-get and pip reach their archives from it): nothing here
    # needs podman's bridge.
    args = ["build", "--format", "docker", "--network", "host", "--file", str(DOCKERFILE), "--build-arg",
            f"PYTHON_IMAGE={base.stdout.strip()}", "--tag", IMAGE]
    if HOST_CA_BUNDLE.is_file():
        # Outbound TLS may be re-signed by the machine's proxy: the build trusts what the host trusts (read-only,
        # during the build only; the image keeps Debian's own bundle). Debian's pip reads the system bundle.
        args += ["--volume", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
    started = time.monotonic()
    podman.run(*args, str(ROOT), timeout=900)
    podman.timings["build"] = time.monotonic() - started
    current = podman.run("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    if previous and previous != current:
        podman.run("rmi", previous, check=False)  # the last run's image, now untagged
    _report(request.config, f"base image {'made' if made else 'cached'} in {podman.timings['base']:.1f} s, "
                            f"gateway image built in {podman.timings['build']:.1f} s")
    return IMAGE


# --- a small recording upstream on the host's loopback, which the containers share (--network host) ------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body_sha256: str
    body_size: int


BOARD = {"id": 1, "name": "Board one", "cards": [{"id": n, "title": f"card {n}"} for n in range(1, 151)],
         "columns": [{"id": 1, "name": "To do"}]}


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: str) -> None:
        self.seen: list[Seen] = []
        self.slow_started = threading.Event()
        super().__init__((address, 0), _UpstreamHandler)


class _UpstreamHandler(http.server.BaseHTTPRequestHandler):
    server: Upstream
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(Seen(self.command, self.path, dict(self.headers.items()),
                                     hashlib.sha256(body).hexdigest(), len(body)))
        if self.path.startswith("/api/latest/boards/1"):
            payload = json.dumps(BOARD).encode()
        else:
            if "slow" in self.path:
                self.server.slow_started.set()
                time.sleep(3)
            payload = json.dumps({"upstream": "host", "path": self.path, "size": len(body),
                                  "sha256": hashlib.sha256(body).hexdigest()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def upstream(podman: Podman) -> Iterator[Upstream]:
    """On 127.0.0.1, which the containers reach as the host does: they share its network."""
    server = Upstream("127.0.0.1")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Container:
    name: str
    port: int
    admin: int
    started: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin}"


class Containers:
    """Starts containers of the image on the host's network, the gateway on free loopback ports; removes them all at
    the end."""

    def __init__(self, podman: Podman, image: str, config: Path) -> None:
        self.podman, self.image, self.config = podman, image, config
        self.names: list[str] = []

    def start(self, *args: str, podman_args: tuple[str, ...] = ()) -> Container:
        port, admin = _free_port(), _free_port()
        name = f"gateway-test-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        started = time.monotonic()
        self.podman.run(
            "run", "--detach", "--name", name,
            # Nothing writable at all: not the root filesystem, and no tmpfs either (one worker writes nothing).
            "--read-only", "--read-only-tmpfs=false",
            # The host's network, the gateway on loopback: the public address appended to the entry point (a later
            # --listen wins), the admin one where the image's health check reads it too.
            "--network", "host", "--env", f"GATEWAY_ADMIN_LISTEN=127.0.0.1:{admin}",
            "--volume", f"{self.config}:/etc/gateway/gateway.yaml:ro",
            # A fixed clock inside the capped phase, whatever today's date.
            "--env", "GATEWAY_NOW=2026-10-15T00:00:00Z",
            *podman_args, self.image, "--listen", f"127.0.0.1:{port}", *args)
        return Container(name, port, admin, started)

    def logs(self, container: Container) -> str:
        out = self.podman.run("logs", container.name, check=False)
        return out.stdout + out.stderr

    def remove_all(self) -> None:
        for name in self.names:
            # --volumes: the anonymous volume of the image's working directory (the usage ledger's file) goes too.
            self.podman.run("rm", "--force", "--volumes", "--time", "0", name, check=False)


@pytest.fixture(scope="module")
def containers(podman: Podman, image: str, upstream: Upstream,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containers]:
    # The shipped config, every company sent to the upstream on the host, with a drain short enough for a test.
    data = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())
    host, port = upstream.server_address[:2]
    assert isinstance(host, str)
    for tenant in data["tenants"]:
        tenant["upstream"] = f"http://{host}:{port}"
    data["server"].update(drain_delay=DRAIN_DELAY, shutdown_timeout=SHUTDOWN_TIMEOUT, admin_token=ADMIN_TOKEN)
    data.setdefault("usage", {}).setdefault("ledger", {})["flush_interval"] = 0.5  # the default SQLite file, soon
    config = tmp_path_factory.mktemp("config") / "gateway.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    config.chmod(0o644)  # read by uid 10001 inside
    manager = Containers(podman, image, config)
    yield manager
    manager.remove_all()


def _get(url: str, headers: dict[str, str] | None = None, data: bytes | None = None,
         timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items()), err.read()


def _wait_live(containers: Containers, container: Container, timeout: float = 30) -> float:
    """Seconds from `podman run` until /livez answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _get(f"{container.admin_url}/livez", timeout=2)[0] == 200:
                return time.monotonic() - container.started
        except OSError:
            pass
        state = containers.podman.inspect(container.name, "{{.State.Status}}")
        assert state == "running", f"the container is {state}:\n{containers.logs(container)}"
        assert time.monotonic() < deadline, f"/livez never answered:\n{containers.logs(container)}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def running(containers: Containers, request: pytest.FixtureRequest) -> Container:
    container = containers.start()
    seconds = _wait_live(containers, container)
    _report(request.config, f"/livez answered {seconds:.1f} s after `podman run`")
    return container


# --- the tests -------------------------------------------------------------------------------------------------------


def test_the_image_keeps_its_health_check_user_and_entry_point(podman: Podman, image: str) -> None:
    """Built in the docker format: the OCI format has no HEALTHCHECK (podman drops it with a mere warning)."""
    inspected = json.loads(podman.run("image", "inspect", image).stdout)[0]
    config, check = inspected["Config"], inspected.get("Healthcheck")
    assert check, "no HEALTHCHECK in the image"
    assert check["Test"] == ["CMD", "python", "-I", "-m", "gateway.ops.probe"]
    assert "GATEWAY_ADMIN_LISTEN=0.0.0.0:9090" in config["Env"]  # what the probe and the entry point read
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"][:4] == ["gateway", "serve", "--config", "/etc/gateway/gateway.yaml"]


def test_the_container_starts_and_answers_livez_and_readyz(running: Container) -> None:
    status, _, body = _get(f"{running.admin_url}/livez")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    status, _, body = _get(f"{running.admin_url}/readyz")
    assert (status, json.loads(body)) == (200, {"status": "ready"})


def test_its_health_check_passes(podman: Podman, running: Container) -> None:
    out = podman.run("healthcheck", "run", running.name, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert podman.inspect(running.name, "{{.State.Health.Status}}") == "healthy"


def test_its_health_check_fails_when_the_admin_port_does_not_answer(podman: Podman, containers: Containers) -> None:
    """The check really asks the admin listener at GATEWAY_ADMIN_LISTEN: moved elsewhere (arguments given after the
    image are appended to the entry point, and an --admin-listen there wins over the variable), the gateway serves
    but the check fails."""
    elsewhere = _free_port()
    container = containers.start("--admin-listen", f"127.0.0.1:{elsewhere}")
    deadline = time.monotonic() + 30
    while "listening on" not in containers.logs(container):
        assert podman.inspect(container.name, "{{.State.Status}}") == "running", containers.logs(container)
        assert time.monotonic() < deadline, containers.logs(container)
        time.sleep(0.1)
    assert f"admin http://127.0.0.1:{elsewhere}" in containers.logs(container)
    assert _get(f"http://127.0.0.1:{elsewhere}/livez")[0] == 200  # alive, where the check does not look
    out = podman.run("healthcheck", "run", container.name, check=False)
    assert out.returncode != 0 and "unhealthy" in out.stdout + out.stderr


def test_it_runs_as_uid_10001_on_a_read_only_root(podman: Podman, running: Container) -> None:
    status = podman.run("exec", running.name, "cat", "/proc/1/status").stdout
    ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if line.startswith(("Uid:", "Gid:"))}
    assert ids == {"Uid": ["10001"] * 4, "Gid": ["10001"] * 4}, ids
    assert "gateway" in podman.run("exec", running.name, "cat", "/proc/1/cmdline").stdout  # PID 1 is the gateway
    assert podman.inspect(running.name, "{{.HostConfig.ReadonlyRootfs}}") == "true"
    for place in ("/opt/gateway/probe", "/tmp/probe", "/etc/gateway/probe"):
        out = podman.run("exec", running.name, "touch", place, check=False)
        assert out.returncode != 0 and "Read-only file system" in out.stderr, (place, out.stderr)


def test_the_c_scanner_is_installed_and_loaded(podman: Podman, containers: Containers, running: Container) -> None:
    out = podman.run("exec", "--workdir", "/", running.name, "python", "-I", "-c",
                     "import gateway.policies.board_cards.json_splice as s, gateway.policies.board_cards._jsonscan as m;"
                     " print(s.NATIVE, m.__file__)")
    native, path = out.stdout.split()
    assert native == "True" and path.startswith("/opt/gateway/lib/"), out.stdout
    # The running gateway would have warned at start without it.
    assert "C JSON scanner" not in containers.logs(running)


def test_it_proxies_to_an_upstream_on_the_host(running: Container, upstream: Upstream,
                                                  containers: Containers) -> None:
    body = os.urandom(1 << 20)
    before = len(upstream.seen)
    status, headers, answer = _get(f"{running.url}/api/v1/things/1?x=1", data=body,
                                   headers={"Authorization": "Bearer image-test-secret",
                                            "Content-Type": "application/octet-stream"})
    assert status == 200, answer
    reply = json.loads(answer)
    assert reply == {"upstream": "host", "path": "/api/v1/things/1?x=1", "size": len(body),
                     "sha256": hashlib.sha256(body).hexdigest()}
    seen = upstream.seen[before]
    assert (seen.method, seen.body_size) == ("POST", len(body))
    assert seen.headers["Via"] == "1.1 deprecation-gateway" and headers["Via"] == "1.1 deprecation-gateway"
    assert seen.headers["Authorization"] == "Bearer image-test-secret"
    # The board policy at work in the container (the fixed clock is in the capped phase): 100 of 150 cards.
    status, headers, answer = _get(f"{running.url}/api/latest/boards/1", headers={"Accept-Encoding": "identity"})
    board = json.loads(answer)
    assert status == 200 and [card["id"] for card in board["cards"]] == list(range(1, 101))
    assert "first 100 of 150 cards" in board["cards_deprecation_message"]
    # One access-log line per request on stdout (written in batches, at most 0.2 s late), with the path but neither
    # the query nor the token.
    deadline = time.monotonic() + 5
    while True:
        logs = containers.logs(running)
        lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
        if [line["path"] for line in lines if line.get("path") == "/api/v1/things/1"]:
            break
        assert time.monotonic() < deadline, logs[-2000:]
        time.sleep(0.1)
    assert len([line for line in lines if line.get("path") == "/api/v1/things/1"]) == 1
    assert "image-test-secret" not in logs and "x=1" not in logs
    # The usage ledger's default SQLite file, in the image's working directory (a volume, writable under the
    # read-only root): the capped board read above is written there.
    query = ("import sqlite3; print(sqlite3.connect('/var/lib/gateway/gateway-usage.sqlite3').execute("
             "\"select coalesce(sum(requests), 0) from usage_totals where behaviour = 'board_cards'\").fetchone()[0])")
    deadline = time.monotonic() + 10
    while True:
        out = containers.podman.run("exec", "--workdir", "/", running.name, "python", "-I", "-c", query, check=False)
        if out.returncode == 0 and out.stdout.strip() not in ("", "0"):
            break
        assert time.monotonic() < deadline, (out.stdout, out.stderr, containers.logs(running)[-2000:])
        time.sleep(0.2)
    assert "usage ledger" not in containers.logs(running).lower() or "unable to open" not in containers.logs(running)


def test_sigterm_drains_within_the_grace_period(podman: Podman, containers: Containers, upstream: Upstream) -> None:
    """`podman stop` sends SIGTERM and kills at the end of the grace period: /readyz turns 503 while the gateway
    still serves, a request in flight is answered whole, and the gateway exits 0 well before the kill."""
    container = containers.start()
    _wait_live(containers, container)
    upstream.slow_started.clear()
    result: dict[str, Any] = {}

    def slow() -> None:
        try:
            result["answer"] = _get(f"{container.url}/api/v1/slow", timeout=30)
        except Exception as err:  # noqa: BLE001 - reported below
            result["error"] = err

    client = threading.Thread(target=slow)
    client.start()
    assert upstream.slow_started.wait(10), "the slow request never reached the upstream"
    started = time.monotonic()
    stop = subprocess.Popen(["podman", "stop", "--time", str(GRACE), container.name], env=podman.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Draining: not ready any more, yet still serving (load balancers are still letting go of the pod).
        deadline = time.monotonic() + DRAIN_DELAY
        while _get(f"{container.admin_url}/readyz", timeout=2)[0] != 503:
            assert time.monotonic() < deadline, "/readyz never turned 503"
            time.sleep(0.05)
        status, _, answer = _get(f"{container.url}/api/v1/cards/2", timeout=5)
        assert status == 200 and json.loads(answer)["path"] == "/api/v1/cards/2"
        client.join(30)
        assert "error" not in result, result.get("error")
        status, _, answer = result["answer"]
        assert status == 200 and json.loads(answer)["path"] == "/api/v1/slow"
        stop.wait(GRACE + 15)
    finally:
        if stop.poll() is None:
            stop.kill()
    elapsed = time.monotonic() - started
    assert stop.returncode == 0, stop.stderr
    assert podman.inspect(container.name, "{{.State.ExitCode}}") == "0", containers.logs(container)
    assert DRAIN_DELAY <= elapsed < GRACE, elapsed
    assert "stopping: draining" in containers.logs(container)


def test_two_workers_under_the_supervisor_alone(podman: Podman, containers: Containers) -> None:
    """`--workers 2` as the example overlay runs it (a tmpfs /tmp, as its emptyDir, for the multiprocess metrics):
    PID 1 checks the config, then becomes the supervisor alone (python -m gateway.ops.workers, none of the gateway
    loaded); both workers serve; one /metrics answers for both; SIGTERM stops them all, exit 0."""
    container = containers.start("--workers", "2", podman_args=("--tmpfs", "/tmp:rw,size=16m,mode=1777"))
    _wait_live(containers, container)
    cmdline = podman.run("exec", container.name, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert cmdline[1:3] == ["-m", "gateway.ops.workers"], cmdline
    maps = podman.run("exec", container.name, "cat", "/proc/1/maps").stdout
    assert "_jsonscan" not in maps and "_http_parser" not in maps
    children = podman.run("exec", container.name, "cat", "/proc/1/task/1/children").stdout.split()
    assert len(children) == 2, children
    for _ in range(20):
        status, _, _ = _get(f"{container.url}/api/v1/cards/3", headers={"Connection": "close"})
        assert status == 200
    status, _, text = _get(f"{container.admin_url}/metrics",
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200, text[:500]
    counted = sum(float(line.rpartition(" ")[2]) for line in text.decode().splitlines()
                  if line.startswith("gateway_requests_total{") and 'route="card"' in line)
    assert counted >= 20, text.decode()[-3000:]
    out = podman.run("stop", "--time", str(GRACE), container.name)
    assert out.returncode == 0, out.stderr
    assert podman.inspect(container.name, "{{.State.ExitCode}}") == "0", containers.logs(container)
    assert "Traceback" not in containers.logs(container)
