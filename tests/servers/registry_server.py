"""Debian's ``docker-registry`` (the CNCF distribution server) on 127.0.0.1, for push tests.

    with Registry(tmp_path) as registry:
        registry.host        # 127.0.0.1:PORT, the registry part of a reference
        registry.requests()  # "PUT /v2/..." lines the server has logged so far
    # the server is stopped (by pid) when the block ends; its storage stays under the given directory

Each server gets its own configuration file and storage directory; ``read_only`` starts it in the
registry's maintenance mode, where every upload is refused, as a registry under maintenance or a
pull-only mirror would.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from tests.servers.loopback import free_ports, terminate, wait_listening

REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
START_TIMEOUT_S = 15.0

CONFIG = """\
version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
    readonly:
      enabled: {read_only}
http:
  addr: 127.0.0.1:{port}
  debug:
    addr: 127.0.0.1:{debug_port}
"""


class Registry:
    """A distribution registry on a free loopback port, storing under ``directory``."""

    def __init__(self, directory: Path, read_only: bool = False) -> None:
        self.directory = directory
        self.read_only = read_only
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT`` of the running server."""
        if self._proc is None:
            raise RuntimeError("Registry is not running; use it as a context manager or call start()")
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "registry.log"

    def requests(self) -> list[str]:
        """The request lines of the server's access log (``PUT /v2/NAME/blobs/uploads/...``)."""
        lines = []
        for line in self.log.read_text(errors="replace").splitlines():
            parts = line.split('"')
            if len(parts) > 1 and parts[1].split(" ")[0] in {"GET", "HEAD", "POST", "PUT", "PATCH"}:
                lines.append(parts[1])
        return lines

    def start(self) -> Registry:
        """Write the configuration, start the server and wait until it accepts connections."""
        if not Path(REGISTRY).exists():
            raise RuntimeError(
                f"{REGISTRY}: docker-registry is not installed (Debian's docker-registry; run .ci/setup)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "storage").mkdir(exist_ok=True)
        self.port, debug_port = free_ports(2)
        config = self.directory / "config.yml"
        config.write_text(
            CONFIG.format(
                storage=self.directory / "storage",
                read_only=str(self.read_only).lower(),
                port=self.port,
                debug_port=debug_port,
            )
        )
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(
                [REGISTRY, "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            code = wait_listening(self._proc, self.port, START_TIMEOUT_S)
        except TimeoutError as error:
            self.stop()
            raise RuntimeError(f"{REGISTRY}: {error}") from None
        if code is not None:
            self._proc = None
            raise RuntimeError(
                f"{REGISTRY}: exited with status {code} on start: {self.log.read_text()[-2000:]}"
            )
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        if self._proc is not None:
            terminate(self._proc)
            self._proc = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
