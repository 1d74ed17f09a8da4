"""A real PostgreSQL server for the tests that need one (the usage ledger for a fleet): Debian's postgresql package,
initialised in a temporary directory and started on a free loopback port, as an unprivileged user (initdb and
postgres refuse root: as root the server runs as the ``postgres`` user the package creates, else ``nobody``).

Password authentication on TCP (scram-sha-256): the tests' URLs carry the password as ``${NAME}``, as an operator's
config does. ``scripts/test.sh`` installs the package with apt-get when it is missing and the suite runs as root;
without it, the tests that need it are skipped, saying why.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.gateway_testlib import free_port

PASSWORD = "ledger-" + uuid.uuid4().hex[:16]  # a secret: never to be seen in logs, /config or errors
USER = "gateway"


def server_binaries() -> Path | None:
    """The newest installed server's bin directory (``PG_BIN`` wins), or None."""
    chosen = os.environ.get("PG_BIN")
    if chosen:
        return Path(chosen) if (Path(chosen) / "initdb").exists() else None
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


@dataclass
class Postgres:
    bin: Path
    directory: Path
    port: int
    run_as: list[str]

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.run_as, *argv], capture_output=True, text=True, timeout=timeout, check=True)

    def url(self, database: str, password: str = "${LEDGER_PASSWORD}") -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, encoding: str | None = None) -> str:
        """A new database; ``encoding``: other than the server's UTF-8 (LATIN1: a database that cannot store every
        character a client may send)."""
        name = "ledger_" + uuid.uuid4().hex[:12]
        options = ["-E", encoding, "-T", "template0", "-l", "C"] if encoding else []
        self._run(str(self.bin / "createdb"), "-h", str(self.directory), "-p", str(self.port), "-U", USER, *options,
                  name)
        return name

    def start(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-l", str(self.directory / "log"),
                  "-w", "-t", "30", "-o", f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c synchronous_commit=off -c full_page_writes=off", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-m", mode, "-w", "-t", "30", "stop")

    def running(self) -> bool:
        done = subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "status"],
                              capture_output=True, text=True, timeout=30)
        return done.returncode == 0

    def log(self) -> str:
        try:
            return (self.directory / "log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""


def start_postgres() -> Postgres:
    """Initialise and start a server; raises RuntimeError (with the reason) when it cannot."""
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError("PostgreSQL is not installed (Debian package postgresql; ./scripts/test.sh installs it "
                           "as root)")
    directory = Path(tempfile.mkdtemp(prefix="gw-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        account = next((name for name in ("postgres", "nobody") if _exists(name)), None)
        runuser = shutil.which("runuser")
        if account is None or runuser is None:
            raise RuntimeError("running as root, and neither a postgres nor a nobody account (or runuser) exists")
        entry = pwd.getpwnam(account)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        run_as = [runuser, "-u", account, "--"]
    directory.chmod(0o700)
    password_file = directory / "password"
    password_file.write_text(PASSWORD + "\n")
    if run_as:
        entry = pwd.getpwnam(run_as[2])
        os.chown(password_file, entry.pw_uid, entry.pw_gid)
    server = Postgres(binaries, directory, free_port(), run_as)
    try:
        server._run(str(binaries / "initdb"), "-D", str(directory / "data"), "-U", USER, "--pwfile",
                    str(password_file), "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                    "--no-sync", timeout=120)
        server.start()
    except subprocess.CalledProcessError as err:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL did not start: {err.stderr.strip()[-500:]}") from None
    return server


def remove(server: Postgres) -> None:
    try:
        if server.running():
            server.stop("immediate")
    finally:
        shutil.rmtree(server.directory, ignore_errors=True)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
