"""Free loopback ports for the servers the tests start (nginx, BuildGrid, PostgreSQL, torch.distributed)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (every probe stays bound until all are chosen)."""
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def free_port() -> int:
    """One free TCP port on 127.0.0.1."""
    return free_ports(1)[0]


def wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float) -> int | None:
    """Wait until ``proc`` accepts TCP connections on 127.0.0.1:``port``.

    Returns ``None`` once it listens, the exit status if it exited first; raises ``TimeoutError`` naming
    the port after ``timeout`` seconds (the process keeps running: the caller stops it).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return None
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"not listening on 127.0.0.1:{port} after {timeout} s")


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server by its pid: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
