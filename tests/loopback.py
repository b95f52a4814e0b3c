"""Free loopback ports for the servers the tests start (nginx, BuildGrid, PostgreSQL, torch.distributed)."""

from __future__ import annotations

import socket


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
