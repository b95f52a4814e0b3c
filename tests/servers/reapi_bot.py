"""Test harness only: a minimal REAPI worker that takes work from BuildGrid through the Bots API.

This is not a product worker: it has no sandbox, no resource limits and no authentication. The remote
tests start it (``tests/servers/buildgrid_server.py``) so that Bazel's ``--remote_executor`` has somewhere
to run actions, on this machine, under the BuildGrid venv's Python, which has ``grpc`` and the REAPI protos.

One bot holds one BotSession with one lease at a time. Per lease it reads the Action and Command from
CAS, materialises the input root in a fresh directory, runs the command with only the action's
environment, uploads outputs (files, directories as Trees, stdout and stderr) and reports the
ActionResult in the completed lease. While a lease runs, the BotSession is kept alive every second.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re_pb2
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2_grpc as re_grpc
from buildgrid._protos.google.bytestream import bytestream_pb2, bytestream_pb2_grpc
from buildgrid._protos.google.devtools.remoteworkers.v1test2 import bots_pb2, bots_pb2_grpc, worker_pb2
from buildgrid._protos.google.rpc import code_pb2

PROPERTIES = (("OSFamily", "linux"), ("ISA", "x86-64"))
BATCH_BYTES = 2 * 1024 * 1024  # BuildGrid's gRPC server takes messages up to 4 MiB
CHUNK = 1024 * 1024
DEFAULT_ACTION_TIMEOUT = 3600.0
# BuildGrid long-polls for work only when 80 % of the deadline is at least 3 s: a shorter deadline makes
# CreateBotSession return at once, so the bot is known to be registered right away.
CREATE_TIMEOUT = 3.5
BOT_STATUS_OK = 1
LEASE_ACTIVE, LEASE_COMPLETED = 2, 4


def digest_of(data: bytes) -> re_pb2.Digest:
    """The SHA-256 REAPI digest of ``data``."""
    return re_pb2.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


class Cas:
    """CAS and ByteStream access for one instance, with a local blob cache on disk."""

    def __init__(self, channel: grpc.Channel, instance: str, cache: Path) -> None:
        self.instance = instance
        self.cas = re_grpc.ContentAddressableStorageStub(channel)
        self.bytestream = bytestream_pb2_grpc.ByteStreamStub(channel)
        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)

    def _cached(self, digest: re_pb2.Digest) -> Path:
        return self.cache / f"{digest.hash}_{digest.size_bytes}"

    def fetch(self, digests: Iterable[re_pb2.Digest]) -> None:
        """Make sure every blob in ``digests`` is in the local cache."""
        wanted = {d.hash: d for d in digests if not self._cached(d).exists()}
        small = [d for d in wanted.values() if d.size_bytes <= CHUNK]
        for digest in wanted.values():
            if digest.size_bytes > CHUNK:
                self._store(digest, self._read_stream(digest))
        for batch in _batches(small):
            response = self.cas.BatchReadBlobs(
                re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digests=batch)
            )
            for item in response.responses:
                if item.status.code != code_pb2.OK:
                    raise RuntimeError(
                        f"CAS blob {item.digest.hash}/{item.digest.size_bytes}: expected status OK, "
                        f"actual {item.status.code} {item.status.message}"
                    )
                self._store(item.digest, item.data)

    def _read_stream(self, digest: re_pb2.Digest) -> bytes:
        name = f"{self.instance}/blobs/{digest.hash}/{digest.size_bytes}"
        parts = self.bytestream.Read(bytestream_pb2.ReadRequest(resource_name=name))
        return b"".join(part.data for part in parts)

    def _store(self, digest: re_pb2.Digest, data: bytes) -> None:
        actual = digest_of(data)
        if actual.hash != digest.hash:
            raise RuntimeError(f"CAS blob: expected sha256 {digest.hash}, actual {actual.hash}")
        target = self._cached(digest)
        partial = target.with_name(target.name + f".{uuid.uuid4().hex}")
        partial.write_bytes(data)
        partial.replace(target)

    def read(self, digest: re_pb2.Digest) -> bytes:
        """The bytes of one blob."""
        self.fetch([digest])
        return self._cached(digest).read_bytes()

    def copy_to(self, digest: re_pb2.Digest, target: Path, executable: bool) -> None:
        """Write a cached blob to ``target`` with mode 0755 or 0644."""
        shutil.copyfile(self._cached(digest), target)
        target.chmod(0o755 if executable else 0o644)

    def upload(self, blobs: dict[str, bytes]) -> None:
        """Upload blobs (keyed by sha256) that the server does not have yet."""
        digests = [digest_of(data) for data in blobs.values()]
        missing = self.cas.FindMissingBlobs(
            re_pb2.FindMissingBlobsRequest(instance_name=self.instance, blob_digests=digests)
        ).missing_blob_digests
        small = [d for d in missing if d.size_bytes <= CHUNK]
        for digest in missing:
            if digest.size_bytes > CHUNK:
                self._write_stream(digest, blobs[digest.hash])
        for batch in _batches(small):
            requests = [re_pb2.BatchUpdateBlobsRequest.Request(digest=d, data=blobs[d.hash]) for d in batch]
            response = self.cas.BatchUpdateBlobs(
                re_pb2.BatchUpdateBlobsRequest(instance_name=self.instance, requests=requests)
            )
            for item in response.responses:
                if item.status.code != code_pb2.OK:
                    raise RuntimeError(
                        f"CAS upload {item.digest.hash}: expected status OK, actual {item.status.code} "
                        f"{item.status.message}"
                    )

    def _write_stream(self, digest: re_pb2.Digest, data: bytes) -> None:
        name = f"{self.instance}/uploads/{uuid.uuid4()}/blobs/{digest.hash}/{digest.size_bytes}"

        def requests() -> Iterator[bytestream_pb2.WriteRequest]:
            for offset in range(0, len(data), CHUNK):
                end = min(offset + CHUNK, len(data))
                yield bytestream_pb2.WriteRequest(
                    resource_name=name if offset == 0 else "",
                    write_offset=offset,
                    data=data[offset:end],
                    finish_write=end == len(data),
                )

        response = self.bytestream.Write(requests())
        if response.committed_size != len(data):
            raise RuntimeError(
                f"ByteStream write {name}: expected {len(data)} bytes committed, "
                f"actual {response.committed_size}"
            )


def _batches(digests: list[re_pb2.Digest]) -> Iterator[list[re_pb2.Digest]]:
    batch: list[re_pb2.Digest] = []
    size = 0
    for digest in digests:
        if batch and size + digest.size_bytes > BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(digest)
        size += digest.size_bytes
    if batch:
        yield batch


def materialise(cas: Cas, root_digest: re_pb2.Digest, root: Path) -> None:
    """Write the input tree ``root_digest`` under ``root``."""
    level = [(root, root_digest)]
    while level:
        cas.fetch(d for _, d in level)
        directories = []
        for path, digest in level:
            directory = re_pb2.Directory()
            directory.ParseFromString(cas.read(digest))
            directories.append((path, directory))
        cas.fetch(f.digest for _, d in directories for f in d.files)
        level = []
        for path, directory in directories:
            path.mkdir(parents=True, exist_ok=True)
            for node in directory.files:
                cas.copy_to(node.digest, path / node.name, node.is_executable)
            for link in directory.symlinks:
                (path / link.name).symlink_to(link.target)
            level.extend((path / d.name, d.digest) for d in directory.directories)


def _tree_of(path: Path, blobs: dict[str, bytes]) -> re_pb2.Tree:
    """The REAPI Tree of an output directory; adds file and directory blobs to ``blobs``."""
    children: dict[str, re_pb2.Directory] = {}

    def walk(current: Path) -> re_pb2.Directory:
        directory = re_pb2.Directory()
        for entry in sorted(current.iterdir(), key=lambda p: p.name):
            if entry.is_symlink():
                directory.symlinks.add(name=entry.name, target=os.readlink(entry))
            elif entry.is_dir():
                child = walk(entry)
                data = child.SerializeToString(deterministic=True)
                digest = digest_of(data)
                children[digest.hash] = child
                directory.directories.add(name=entry.name, digest=digest)
            else:
                data = entry.read_bytes()
                blobs[hashlib.sha256(data).hexdigest()] = data
                directory.files.add(
                    name=entry.name, digest=digest_of(data), is_executable=os.access(entry, os.X_OK)
                )
        return directory

    root = walk(path)
    return re_pb2.Tree(root=root, children=list(children.values()))


def collect_outputs(cas: Cas, command: re_pb2.Command, workdir: Path, result: re_pb2.ActionResult) -> None:
    """Upload the command's outputs that exist under ``workdir`` and list them in ``result``."""
    blobs: dict[str, bytes] = {}
    paths = list(command.output_paths) or [*command.output_files, *command.output_directories]
    for rel in paths:
        path = workdir / rel
        if path.is_dir() and not path.is_symlink():
            tree = _tree_of(path, blobs)
            data = tree.SerializeToString(deterministic=True)
            blobs[hashlib.sha256(data).hexdigest()] = data
            result.output_directories.add(path=rel, tree_digest=digest_of(data))
        elif path.is_file():
            data = path.read_bytes()
            blobs[hashlib.sha256(data).hexdigest()] = data
            result.output_files.add(path=rel, digest=digest_of(data), is_executable=os.access(path, os.X_OK))
    cas.upload(blobs)


def execute(cas: Cas, action: re_pb2.Action, scratch: Path, label: str) -> re_pb2.ActionResult:
    """Run one action in a fresh directory under ``scratch`` and return its ActionResult.

    Prints ``label`` with the action's platform properties and program when it starts (the tests check
    them), and with the exit code and where the time went when it ends.
    """
    command = re_pb2.Command()
    command.ParseFromString(cas.read(action.command_digest))
    properties = action.platform.properties or command.platform.properties
    platform = ",".join(f"{p.name}={p.value}" for p in properties)
    print(f"{label} platform {platform or '-'} program {command.arguments[0]}", flush=True)
    root = scratch / uuid.uuid4().hex
    started = time.monotonic()
    try:
        materialise(cas, action.input_root_digest, root)
        materialised = time.monotonic()
        workdir = root / command.working_directory
        for rel in [*command.output_paths, *command.output_files, *command.output_directories]:
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        env = {v.name: v.value for v in command.environment_variables}
        timeout = action.timeout.seconds or DEFAULT_ACTION_TIMEOUT
        result = re_pb2.ActionResult()
        try:
            proc = subprocess.run(
                list(command.arguments),
                cwd=workdir,
                env=env,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            result.exit_code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as error:
            result.exit_code = 124
            stdout = error.stdout or b""
            stderr = (error.stderr or b"") + f"\naction timed out after {timeout} s\n".encode()
        except OSError as error:
            result.exit_code = 127
            stdout, stderr = b"", f"{command.arguments[0]}: {error}\n".encode()
        ran = time.monotonic()
        cas.upload({hashlib.sha256(b).hexdigest(): b for b in (stdout, stderr)})
        result.stdout_digest.CopyFrom(digest_of(stdout))
        result.stderr_digest.CopyFrom(digest_of(stderr))
        collect_outputs(cas, command, workdir, result)
        print(
            f"{label} exit {result.exit_code}: inputs {materialised - started:.1f} s, "
            f"run {ran - materialised:.1f} s, outputs {time.monotonic() - ran:.1f} s",
            flush=True,
        )
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Bot:
    """One BotSession: long-polls for a lease, runs it in a thread, reports it completed."""

    def __init__(self, server: str, instance: str, name: str, workdir: Path, keepalive: float) -> None:
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        self.channel = grpc.insecure_channel(server, options=options)
        self.bots = bots_pb2_grpc.BotsStub(self.channel)
        self.cas = Cas(self.channel, instance, workdir / "blobs")
        self.instance = instance
        self.name = name
        self.scratch = workdir / "actions"
        self.keepalive = keepalive
        self.done = threading.Event()
        self.results: dict[str, tuple[re_pb2.ActionResult | None, str]] = {}
        self.running: set[str] = set()

    def _new_bot_session(self) -> bots_pb2.BotSession:
        device = worker_pb2.Device(handle=self.name)
        for key, value in PROPERTIES:
            device.properties.add(key=key, value=value)
        return bots_pb2.BotSession(
            bot_id=f"{self.name}-{os.getpid()}",
            status=BOT_STATUS_OK,
            worker=worker_pb2.Worker(devices=[device]),
        )

    def _run_lease(self, lease: bots_pb2.Lease) -> None:
        try:
            action = re_pb2.Action()
            if not lease.payload.Unpack(action):
                digest = re_pb2.Digest()
                lease.payload.Unpack(digest)
                action.ParseFromString(self.cas.read(digest))
            result = execute(self.cas, action, self.scratch, f"{self.name}: lease {lease.id}")
            self.results[lease.id] = (result, "")
        except Exception as error:  # reported to the server as the lease's status
            self.results[lease.id] = (None, f"{type(error).__name__}: {error}")
            print(f"{self.name}: lease {lease.id} failed: {error}", file=sys.stderr, flush=True)
        self.done.set()

    def _update(self, bot_session: bots_pb2.BotSession) -> None:
        for lease in bot_session.leases:
            if lease.state == LEASE_ACTIVE and lease.id in self.results:
                result, error = self.results.pop(lease.id)
                self.running.discard(lease.id)
                lease.state = LEASE_COMPLETED
                if result is None:
                    lease.status.code = code_pb2.INTERNAL
                    lease.status.message = error
                else:
                    lease.status.code = code_pb2.OK
                    lease.result.Pack(result)
            elif lease.state == LEASE_ACTIVE and lease.id not in self.running:
                self.running.add(lease.id)
                work = bots_pb2.Lease()
                work.CopyFrom(lease)
                threading.Thread(target=self._run_lease, args=(work,), daemon=True).start()

    def run(self) -> None:
        """Serve leases until the process is killed."""
        request = bots_pb2.CreateBotSessionRequest(parent=self.instance, bot_session=self._new_bot_session())
        bot_session = self.bots.CreateBotSession(request, timeout=CREATE_TIMEOUT)
        print(f"{self.name}: BotSession {bot_session.name}", flush=True)
        while True:
            self._update(bot_session)
            if self.running:
                self.done.wait(1.0)
                self.done.clear()
                self._update(bot_session)
            try:
                bot_session = self.bots.UpdateBotSession(
                    bots_pb2.UpdateBotSessionRequest(name=bot_session.name, bot_session=bot_session),
                    timeout=self.keepalive,
                )
            except grpc.RpcError as error:
                if error.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                    raise
                time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run one bot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="host:port of the Bots, CAS and ByteStream services")
    parser.add_argument("--instance", default="", help="REAPI instance name")
    parser.add_argument("--name", default="bot", help="bot id prefix")
    parser.add_argument("--workdir", type=Path, required=True, help="scratch and blob cache directory")
    parser.add_argument("--keepalive", type=float, default=10.0, help="long-poll timeout in seconds (> 4)")
    args = parser.parse_args(argv)
    bot = Bot(args.server, args.instance, args.name, args.workdir, args.keepalive)
    bot.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
