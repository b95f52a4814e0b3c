"""How tests run a container: rootful podman on a CI machine needs runc (not crun) and explicit ulimits
(FACTS.md)."""

from __future__ import annotations

PODMAN_RUN = [
    "podman",
    "--runtime",
    "runc",
    "run",
    "--rm",
    "--network=none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
]
