"""A private BuildGrid (REAPI) service for tests: PostgreSQL cluster, cache or execution server, test bots.

Everything listens on 127.0.0.1 ports picked at start, lives in temporary directories, and is stopped by
process id when its context manager exits. BuildGrid runs from its own venv (``.ci/setup-buildgrid``).
By hand (benchmarks, trying a build): ``python -m tests.servers.buildgrid_server [--bots N]`` prints the Bazel
flags and serves until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bazel_util import Workspace, remove_tree
from tests.servers.loopback import free_port

CACHE = Path(os.environ.get("SPARKSEAL_CACHE", Path.home() / ".cache" / "sparkseal"))
VENV = CACHE / "buildgrid-venv"
PYTHON = VENV / "bin" / "python"
BGD = VENV / "bin" / "bgd"
BOT = Path(__file__).resolve().parent / "reapi_bot.py"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
INSTANCE = "main"
START_TIMEOUT = 60.0

_COMMON = """\
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
monitoring:
  enabled: false
# An action with thousands of inputs (the kernels wheel's compilers, sysroot and CMake modules) has Bazel
# start many uploads at once (about 100 per connection; the tests pass --remote_max_connections=1), and
# refused ones end as "N errors during bulk transfer". BuildGrid 0.4 admits as many concurrent RPCs as
# its gRPC thread pool has threads and refuses the rest (RESOURCE_EXHAUSTED): 32 threads refused 118 of
# 150 concurrent uploads. Threads are made only as RPCs arrive.
thread-pool-size: 1000
storages:
  - !disk-storage &cas
    path: "{cas}"
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 100000
    allow-updates: true
    cache-failed-actions: false
"""

_CACHE_INSTANCES = """\
instances:
  - name: "{instance}"
    services:
      - !action-cache
        cache: *ac
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
"""

_EXECUTION = """\
connections:
  - !sql-connection &sql
    connection-string: "{database}"
    pool-size: 5
    max-overflow: 10
schedulers:
  - !sql-scheduler &scheduler
    sql: *sql
    storage: *cas
    action-cache: *ac
    bot-session-keepalive-timeout: {keepalive}
    max-execution-timeout: {max_execution}
instances:
  - name: "{instance}"
    services:
      - !action-cache
        cache: *ac
      - !execution
        scheduler: *scheduler
        operation-stream-keepalive-timeout: 10
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
"""


def venv_missing_reason() -> str | None:
    """Why the BuildGrid venv cannot be used, or None when it can."""
    if not BGD.is_file() or not PYTHON.is_file():
        return (
            f"BuildGrid venv {VENV}: expected {BGD} and {PYTHON}, actual: missing (run .ci/setup-buildgrid)"
        )
    return None


def require_buildgrid() -> None:
    """Skip the calling test when the BuildGrid venv is missing; in CI (``CI=true``) fail instead."""
    reason = venv_missing_reason()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run .ci/setup first")
    pytest.skip(reason)


def discard_workspace(ws: Workspace) -> None:
    """Stop ``ws``'s Bazel server (by its pid if ``bazel shutdown`` does not) and delete its output base."""
    pid_file = ws.output_base / "server" / "server.pid.txt"
    pid = int(pid_file.read_text()) if pid_file.is_file() else None
    with contextlib.suppress(subprocess.TimeoutExpired):
        ws.shutdown()
    cmdline = Path(f"/proc/{pid}/cmdline")
    with contextlib.suppress(OSError):
        if pid is not None and str(ws.output_base).encode() in cmdline.read_bytes():
            os.kill(pid, signal.SIGKILL)
    remove_tree(ws.output_base)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with code {proc.returncode} before listening on 127.0.0.1:{port}; "
                f"log {log}:\n{log.read_text(errors='replace')[-4000:]}"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(
        f"{what}: expected a listener on 127.0.0.1:{port} within {START_TIMEOUT:.0f} s, actual: none; "
        f"log {log}:\n{log.read_text(errors='replace')[-4000:]}"
    )


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Stop ``proc`` and its process group by pid: SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for_bot(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until a bot has registered its BotSession (it prints one line when it has)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if ": BotSession " in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"bot {log}: exited with code {proc.returncode} before registering:\n{text}")
        time.sleep(0.1)
    raise RuntimeError(
        f"bot {log}: expected a BotSession within {START_TIMEOUT:.0f} s, actual: none:\n"
        f"{log.read_text(errors='replace')}"
    )


@contextmanager
def postgres() -> Iterator[str]:
    """A private PostgreSQL 15 cluster (trust auth, 127.0.0.1 only); yields its SQLAlchemy URL.

    PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres`` user and lives
    in a directory of its own under the system temporary directory (pytest's are private to root).
    """
    initdb, pg_ctl = PG_BIN / "initdb", PG_BIN / "pg_ctl"
    if not initdb.is_file():
        raise RuntimeError(f"PostgreSQL: expected {initdb}, actual: missing (Debian package postgresql)")
    as_root = os.geteuid() == 0
    user = "postgres" if as_root else None
    top = Path(tempfile.mkdtemp(prefix="sparkseal-pg-"))
    try:
        if as_root:
            shutil.chown(top, user="postgres", group="postgres")
        data, sockets, log = top / "data", top / "sockets", top / "server.log"
        run = subprocess.run(
            [
                str(initdb),
                "-D",
                str(data),
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
                "--locale=C",
                "--encoding=UTF8",
            ],
            cwd=top,
            capture_output=True,
            text=True,
            user=user,
            check=False,
        )
        if run.returncode != 0:
            raise RuntimeError(f"initdb {data}: expected exit code 0, actual {run.returncode}:\n{run.stderr}")
        sockets.mkdir()
        if as_root:
            shutil.chown(sockets, user="postgres", group="postgres")
        port = free_port()
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
        start = subprocess.run(
            [str(pg_ctl), "-D", str(data), "-o", options, "-l", str(log), "-w", "-t", "60", "start"],
            cwd=top,
            capture_output=True,
            text=True,
            user=user,
            check=False,
        )
        if start.returncode != 0:
            detail = log.read_text(errors="replace") if log.exists() else start.stderr
            raise RuntimeError(
                f"pg_ctl start {data}: expected exit code 0, actual {start.returncode}:\n{detail}"
            )
        try:
            # psycopg2 by name: SQLAlchemy 2.1's default PostgreSQL driver is psycopg 3, on whose connections
            # BuildGrid 0.4's job notifier calls psycopg2's poll() in a loop.
            yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                [str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"],
                cwd=top,
                capture_output=True,
                user=user,
                check=False,
            )
    finally:
        shutil.rmtree(top, ignore_errors=True)


@dataclass
class BuildGrid:
    """A running BuildGrid server."""

    port: int
    instance: str
    workdir: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """The ``grpc://`` URL Bazel's ``--remote_cache`` / ``--remote_executor`` take."""
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """The server's combined stdout and stderr."""
        return self.workdir / "server.log"


@contextmanager
def buildgrid(
    workdir: Path, database: str | None = None, keepalive: int = 10, max_execution: int = 600
) -> Iterator[BuildGrid]:
    """Run BuildGrid with a disk CAS and an in-memory action cache; with ``database``, also execution.

    ``keepalive`` is how long (s) a silent bot keeps its lease; ``max_execution`` bounds one action (s).
    """
    reason = venv_missing_reason()
    if reason:
        raise RuntimeError(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "cas").mkdir(exist_ok=True)
    port = free_port()
    text = _COMMON.format(port=port, cas=workdir / "cas")
    if database is None:
        text += _CACHE_INSTANCES.format(instance=INSTANCE)
    else:
        text += _EXECUTION.format(
            database=database, keepalive=keepalive, max_execution=max_execution, instance=INSTANCE
        )
        migrate = subprocess.run(
            [str(BGD), "migrate", "apply", database], capture_output=True, text=True, check=False
        )
        if migrate.returncode != 0:
            raise RuntimeError(
                f"bgd migrate apply {database}: expected exit code 0, actual {migrate.returncode}:\n"
                f"{migrate.stdout}{migrate.stderr}"
            )
    config = workdir / "buildgrid.yml"
    config.write_text(text)
    server = BuildGrid(
        port, INSTANCE, workdir, _spawn([str(BGD), "server", "start", str(config)], workdir / "server.log")
    )
    try:
        _wait_for_port(port, server.proc, server.log, f"bgd server start {config}")
        yield server
    finally:
        stop_process(server.proc)
        remove_tree(workdir / "cas")


@contextmanager
def bots(server: BuildGrid, workdir: Path, count: int = 1, keepalive: int = 10) -> Iterator[list[Path]]:
    """Run ``count`` test bots (``tests/servers/reapi_bot.py``) against ``server``; yields their log files."""
    workdir.mkdir(parents=True, exist_ok=True)
    logs = [workdir / f"bot-{n}.log" for n in range(count)]
    with ExitStack() as stack:
        for n, log in enumerate(logs):
            command = [
                str(PYTHON),
                str(BOT),
                "--server",
                f"127.0.0.1:{server.port}",
                "--instance",
                server.instance,
                "--name",
                f"bot-{n}",
                "--workdir",
                str(workdir / f"bot-{n}"),
                "--keepalive",
                str(keepalive),
            ]
            stack.callback(remove_tree, workdir / f"bot-{n}")
            proc = _spawn(command, log)
            stack.callback(stop_process, proc)
            _wait_for_bot(proc, log)
        yield logs


def main(argv: list[str] | None = None) -> int:
    """Serve a local REAPI cache (or, with ``--bots N``, execution with N bots) until interrupted."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--bots", type=int, default=0, help="bots to start; 0 serves a cache only")
    parser.add_argument("--keepalive", type=int, default=10, help="seconds a silent bot keeps its lease")
    args = parser.parse_args(argv)
    reason = venv_missing_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sparkseal-reapi-")))
        database = stack.enter_context(postgres()) if args.bots else None
        server = stack.enter_context(buildgrid(workdir / "server", database, keepalive=args.keepalive))
        flags = [f"--remote_cache={server.url}", f"--remote_instance_name={server.instance}"]
        if args.bots:
            stack.enter_context(bots(server, workdir / "bots", count=args.bots, keepalive=args.keepalive))
            flags = ["--config=rbe", f"--remote_executor={server.url}", flags[1]]
        else:
            flags.insert(0, "--config=remote-cache")
        print("bazel build flags: " + " ".join(flags), flush=True)
        print(f"logs in {workdir}; Ctrl-C stops", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
