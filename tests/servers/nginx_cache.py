"""A Debian nginx WebDAV server on 127.0.0.1, used as Bazel's HTTP remote cache in tests and benchmarks.

    with NginxCache() as cache:
        cache.url            # http://127.0.0.1:PORT, for --remote_cache=
        cache.read_only_url  # the same store, where every PUT is refused (403)
        cache.root / "cas"   # blobs by sha256, as Bazel uploads them; cache.root / "ac": action results
    # the server is stopped (by pid) and its directory removed when the block ends

nginx runs in the foreground (``daemon off``) so that the process started here is its master; ``stop()``
sends it SIGTERM and waits. Its workers run as ``nobody`` when started by root, so the cache and temporary
directories are handed to that user, and every directory above them is left traversable.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from tests.servers.loopback import free_ports, terminate, wait_listening

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
WORKER_USER = "nobody"
START_TIMEOUT_S = 10.0
# Bazel's HTTP cache client opens up to --remote_max_connections (100 by default) at once; with fewer
# worker connections nginx drops some and Bazel warns "Writing to Remote Cache: N errors during bulk
# transfer".
WORKER_CONNECTIONS = 1024

CONFIG = """\
worker_processes 1;
worker_rlimit_nofile 4096;
pid {state}/nginx.pid;
error_log {state}/error.log warn;
{user}
events {{ worker_connections {connections}; }}
http {{
    access_log {state}/access.log;
    client_body_temp_path {state}/client_body;
    proxy_temp_path {state}/proxy;
    fastcgi_temp_path {state}/fastcgi;
    uwsgi_temp_path {state}/uwsgi;
    scgi_temp_path {state}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        client_max_body_size 4g;
        dav_methods PUT;
        create_full_put_path on;
        dav_access user:rw group:r all:r;
    }}
    server {{
        listen 127.0.0.1:{read_only_port};
        root {root};
        location / {{
            limit_except GET HEAD {{ deny all; }}
        }}
    }}
}}
"""


class NginxCache:
    """An nginx WebDAV server on a free loopback port, serving and storing files under ``root``."""

    def __init__(self, parent: Path | None = None) -> None:
        self._parent = parent
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.read_only_port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        if self._proc is None:
            raise RuntimeError("NginxCache is not running; use it as a context manager or call start()")
        return f"http://127.0.0.1:{self.port}"

    @property
    def read_only_url(self) -> str:
        """``http://127.0.0.1:PORT`` serving the same store read only, as a server for forks would."""
        if self._proc is None:
            raise RuntimeError("NginxCache is not running; use it as a context manager or call start()")
        return f"http://127.0.0.1:{self.read_only_port}"

    @property
    def root(self) -> Path:
        """The directory the server stores uploads in (Bazel writes ``cas/`` and ``ac/`` here)."""
        if self._dir is None:
            raise RuntimeError("NginxCache is not running; use it as a context manager or call start()")
        return self._dir / "root"

    @property
    def pid(self) -> int:
        """The pid of the nginx master process."""
        if self._proc is None:
            raise RuntimeError("NginxCache is not running")
        return self._proc.pid

    def access_log(self) -> list[str]:
        """The request lines logged so far (``"PUT /cas/<sha256> HTTP/1.1"`` ...)."""
        log = self.root.parent / "state" / "access.log"
        return [line.split('"')[1] for line in log.read_text().splitlines() if '"' in line]

    def start(self) -> NginxCache:
        """Write the configuration, start nginx and wait until it accepts connections."""
        if not Path(NGINX).exists():
            raise RuntimeError(f"{NGINX}: nginx is not installed (expected Debian's nginx; run .ci/setup)")
        self._dir = Path(tempfile.mkdtemp(prefix="sparkseal-nginx-", dir=self._parent))
        self._dir.chmod(0o755)
        root, state = self._dir / "root", self._dir / "state"
        for directory in (root, state):
            directory.mkdir()
        user = ""
        if os.geteuid() == 0:
            worker = pwd.getpwnam(WORKER_USER)
            # nginx's default group is the user's name, but Debian's nobody belongs to nogroup.
            user = f"user {WORKER_USER} {grp.getgrgid(worker.pw_gid).gr_name};"
            for directory in (root, state):
                os.chown(directory, worker.pw_uid, worker.pw_gid)
        self.port, self.read_only_port = free_ports(2)
        config = state / "nginx.conf"
        config.write_text(
            CONFIG.format(
                state=state,
                user=user,
                port=self.port,
                read_only_port=self.read_only_port,
                root=root,
                connections=WORKER_CONNECTIONS,
            )
        )
        self._proc = subprocess.Popen(
            [NGINX, "-p", str(state), "-c", str(config), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_until_listening(state / "error.log")
        return self

    def _wait_until_listening(self, error_log: Path) -> None:
        assert self._proc is not None
        try:
            code = wait_listening(self._proc, self.port, START_TIMEOUT_S)
        except TimeoutError as error:
            self.stop()
            raise RuntimeError(f"{NGINX}: {error}") from None
        if code is not None:
            stderr = self._proc.stderr.read().decode() if self._proc.stderr else ""
            log = error_log.read_text() if error_log.exists() else ""
            self._proc = None
            self._cleanup()
            raise RuntimeError(
                f"{NGINX}: exited with status {code} on start (expected to keep running): {stderr}{log}"
            )

    def stop(self) -> None:
        """Stop the nginx master (SIGTERM, then SIGKILL after 10 s) and remove the server's directory."""
        if self._proc is not None:
            terminate(self._proc)
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> NginxCache:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
