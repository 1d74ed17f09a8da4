"""deploy/Dockerfile, linted without a container engine: parsed with BuildKit's own parser (the `dockerfile`
package) and checked against the rules the image follows; its entry point and health check run here as a process."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import dockerfile  # type: ignore[import-not-found]  # a C extension with no type information
import pytest
import yaml

from tests.gateway_testlib import free_port

from .deploy_testlib import DOCKERFILE, ROOT

Instruction = Any


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    out: list[list[Instruction]] = []
    for ins in instructions:
        if ins.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def args(instructions: list[Instruction]) -> dict[str, str]:
    """Global ARG defaults (before the first FROM)."""
    out = {}
    for ins in instructions:
        if ins.cmd == "FROM":
            break
        if ins.cmd == "ARG":
            name, _, default = ins.value[0].partition("=")
            out[name] = default
    return out


def environment(stage: list[Instruction]) -> dict[str, str]:
    """The ENV a stage sets (each instruction's pairs)."""
    values = [v for ins in stage if ins.cmd == "ENV" for v in ins.value]
    return dict(zip(values[::2], values[1::2], strict=True))


def base_image(ins: Instruction, defaults: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], ins.value[0])


def test_multi_stage_on_a_pinned_slim_python_311(instructions: list[Instruction]) -> None:
    found = stages(instructions)
    assert len(found) >= 2, "a build stage and a runtime stage"
    defaults = args(instructions)
    for stage in found:
        image = base_image(stage[0], defaults)
        name, _, tag = image.partition(":")
        assert name in ("python", "docker.io/library/python"), image
        # An exact patch release of 3.11 on a named Debian release, never a moving tag.
        assert re.fullmatch(r"3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", tag), image
    assert "latest" not in DOCKERFILE.read_text()
    # The runtime stage copies the virtual environment built in the first stage.
    build_name = found[0][0].value[-1]
    copies = [i for i in found[-1] if i.cmd == "COPY"]
    assert any(f"--from={build_name}" in i.flags for i in copies)


def test_runs_as_a_numeric_non_root_user(instructions: list[Instruction]) -> None:
    runtime = stages(instructions)[-1]
    users = [i.value[0] for i in runtime if i.cmd == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric uid, so that Kubernetes' runAsNonRoot can verify it"
    # The Deployment runs as the same user.
    deployment = yaml.safe_load((ROOT / "deploy/kubernetes/base/deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


def test_dependencies_come_from_the_lock_before_the_source(instructions: list[Instruction]) -> None:
    build = stages(instructions)[0]
    steps = [(i.cmd, i) for i in build]
    copy_lock = next(n for n, (cmd, i) in enumerate(steps) if cmd == "COPY" and "requirements.lock" in i.value[:-1])
    copy_source = next(n for n, (cmd, i) in enumerate(steps) if cmd == "COPY" and any(
        v.rstrip("/") in ("gateway", ".") for v in i.value[:-1]))
    installs = [n for n, (cmd, i) in enumerate(steps) if cmd == "RUN" and "pip install" in i.value[0]]
    # Layer caching: the lock is copied and the dependencies installed before any source file arrives.
    assert copy_lock < installs[0] < copy_source
    dependency_install = steps[installs[0]][1].value[0]
    assert "--constraint requirements.lock" in dependency_install or "-c requirements.lock" in dependency_install
    for n in installs:
        command = steps[n][1].value[0]
        for part in re.split(r"&&|;", command):
            if "pip install" not in part:
                continue
            # Every package installed is pinned: by the lock, exactly (==), or the project itself without deps.
            assert ("requirements.lock" in part or "--no-deps" in part
                    or re.search(r"pip install\s+[\w.-]+==[\w.]+\s*$", part.strip())), part


def test_the_lock_pins_every_runtime_dependency() -> None:
    """The image installs pyproject's runtime dependencies constrained by the lock: the lock must pin all of them,
    transitively, or a dependency would float."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pinned = {norm(line.split("==")[0]) for line in (ROOT / "requirements.lock").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    import tomllib

    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        assert name in pinned, f"runtime dependency {req.name} is not pinned in requirements.lock"
        todo.extend(Requirement(r) for r in requires(req.name) or [])


def test_default_config_is_baked_in_and_the_entry_point_serves_it(instructions: list[Instruction]) -> None:
    runtime = stages(instructions)[-1]
    copies = [i.value for i in runtime if i.cmd == "COPY"]
    assert ("config/gateway.yaml", "/etc/gateway/gateway.yaml") in copies
    entrypoint = next(i for i in runtime if i.cmd == "ENTRYPOINT")
    assert entrypoint.json, "exec form, so that the gateway is PID 1 and receives SIGTERM"
    argv = list(entrypoint.value)
    assert argv[:4] == ["gateway", "serve", "--config", "/etc/gateway/gateway.yaml"]
    assert argv[argv.index("--listen") + 1] == "0.0.0.0:8080"
    # The admin address from the environment, which the health check reads too (not from the command line: an
    # --admin-listen there would move the listener without the check).
    assert "--admin-listen" not in argv
    assert environment(runtime)["GATEWAY_ADMIN_LISTEN"] == "0.0.0.0:9090"
    exposed = {p for i in runtime if i.cmd == "EXPOSE" for p in i.value}
    assert {"8080", "9090"} <= exposed


def test_health_check_is_the_standard_library_probe_of_the_admin_address(instructions: list[Instruction]) -> None:
    checks = [i for i in stages(instructions)[-1] if i.cmd == "HEALTHCHECK"]
    assert len(checks) == 1
    check = checks[0]
    assert check.value[0] == "CMD" and check.json
    assert list(check.value[1:]) == ["python", "-I", "-m", "gateway.ops.probe"]
    # The probe imports the standard library alone (it runs every 30 s beside the gateway).
    probe = (ROOT / "gateway/ops/probe.py").read_text()
    imported = set(re.findall(r"^(?:from|import) ([\w.]+)", probe, re.M))
    assert imported <= {"__future__", "os", "sys", "urllib.request", "collections.abc"}, imported


def test_every_copied_path_exists_and_is_not_ignored(instructions: list[Instruction]) -> None:
    ignore = [line.strip() for line in (ROOT / "deploy/Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        result = False
        for pattern in ignore:
            negate = pattern.startswith("!")
            pattern = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                result = not negate
        return result

    for ins in instructions:
        if ins.cmd != "COPY" or any(f.startswith("--from=") for f in ins.flags):
            continue
        for source in ins.value[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not ignored(source.rstrip("/")), f"COPY {source}: excluded by deploy/Dockerfile.dockerignore"


def test_every_console_script_of_the_package_is_in_the_image(instructions: list[Instruction]) -> None:
    """A script pyproject.toml installs must point into a package the image copies (a `sandbox` script once did not:
    the sandbox stays out of the image)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    copied = {source.rstrip("/") for ins in instructions if ins.cmd == "COPY" and not any(
        f.startswith("--from=") for f in ins.flags) for source in ins.value[:-1]}  # fmt: skip
    for name, target in scripts.items():
        package = target.partition(":")[0].split(".")[0]
        assert package in copied, f"script {name} -> {target}: the image does not copy {package}/"


def _healthcheck_argv(instructions: list[Instruction]) -> list[str]:
    check = next(i for i in instructions if i.cmd == "HEALTHCHECK")
    argv = list(check.value[1:])
    return [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]


def test_entry_point_and_health_check_work_as_a_process(instructions: list[Instruction], tmp_path: Path) -> None:
    """The image's command (on free loopback ports: the public one on its command line, the admin one in
    GATEWAY_ADMIN_LISTEN, wildcard as in the image; the repository's default config) starts, passes the image's own
    health check, which follows the variable, and stops with 0 on SIGTERM."""
    entrypoint = list(next(i for i in instructions if i.cmd == "ENTRYPOINT").value)
    port, admin = free_port(), free_port()
    argv = [sys.executable, "-m", "gateway", *entrypoint[1:]]
    argv[argv.index("/etc/gateway/gateway.yaml")] = str(ROOT / "config/gateway.yaml")
    argv[argv.index("0.0.0.0:8080")] = f"127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATEWAY_ADMIN_LISTEN": f"0.0.0.0:{admin}"}
    health = _healthcheck_argv(instructions)

    def healthy(environ: dict[str, str] = env) -> bool:
        return subprocess.run(health, capture_output=True, timeout=10, env=environ, cwd=ROOT).returncode == 0

    assert not healthy(), "fails while nothing listens"
    log = (tmp_path / "gateway.log").open("wb")
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 15
        while True:
            if healthy():
                break
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            assert time.monotonic() < deadline, "the health check never passed"
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as resp:
            assert json.loads(resp.read()) == {"status": "ready"}
        # The check asks the address the variable names, nothing else.
        assert not healthy({**env, "GATEWAY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}"})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        log.close()


@pytest.mark.parametrize(("value", "url"), [
    ("0.0.0.0:9090", "http://127.0.0.1:9090/livez"),
    ("127.0.0.1:9191", "http://127.0.0.1:9191/livez"),
    ("[::]:9090", "http://[::1]:9090/livez"),
    ("[::1]:9090", "http://[::1]:9090/livez"),
    ("", "http://127.0.0.1:9090/livez"),
])
def test_the_probe_asks_the_admin_address_on_loopback_for_a_wildcard(value: str, url: str) -> None:
    from gateway.ops.probe import livez_url

    assert livez_url({"GATEWAY_ADMIN_LISTEN": value}) == url


def test_serve_and_the_probe_refuse_a_malformed_admin_address(tmp_path: Path) -> None:
    env = {**os.environ, "GATEWAY_ADMIN_LISTEN": "nine-oh-nine-oh"}
    serve = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(ROOT / "config/gateway.yaml")],
                           capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert serve.returncode == 2 and "GATEWAY_ADMIN_LISTEN" in serve.stderr and "Traceback" not in serve.stderr
    probe = subprocess.run([sys.executable, "-I", "-m", "gateway.ops.probe"], capture_output=True, text=True,
                           timeout=30, env=env)
    assert probe.returncode == 1 and "GATEWAY_ADMIN_LISTEN" in probe.stderr
