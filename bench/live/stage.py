"""Stage wheels onto a GPU machine that has no network and takes a bounded amount of data per transfer.

The live runs (bench/results/live_h200.md) serve our vLLM wheel on an H200 machine: its own torch and
NVIDIA libraries are used where they are exactly the versions we lock, and every other dependency
travels as a wheel for that machine's Python. Each transfer carries at most a few tens of MiB, so the
wheels are packed into one tar stream, split into numbered parts, and each part is checked by sha256 on
arrival; the wheels themselves are checked again after reassembly. The unpatched upstream vLLM wheel
shares every compiled member with ours byte for byte, so it travels as a delta against our wheel and is
rebuilt there to its locked sha256.

Build side::

    python3 bench/live/stage.py plan --installed piplist.json --out .stage/plan.json
    python3 bench/live/stage.py fetch --plan .stage/plan.json --dir .stage/wheels
    python3 bench/live/stage.py delta make --base ours.whl --target upstream.whl --out X.delta
    python3 bench/live/stage.py pack --name deps --out .stage --part-mib 60 FILE...

GPU side (standard library and ``sparkseal.core``; the repository is the working directory)::

    python3 bench/live/stage.py receive .stage/deps-01 [.stage/deps-02 ...]
    python3 bench/live/stage.py unpack deps --dest /tmp/sparkseal-stage/deps
    python3 bench/live/stage.py delta apply --base ours.whl --delta X.delta --out upstream.whl
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sparkseal.core.digests import sha256_file
from sparkseal.core.wheels import normalize_name, parse_wheel_filename

STAGE_ROOT = Path("/tmp/sparkseal-stage")

# Locked packages not staged for the Qwen3 test model: each is reached only on paths that model does not
# take on an H200 (checked by importing vLLM's serving, engine, GPU model runner and DSpark modules
# without them, and by the live runs themselves).
NOT_STAGED = {
    "flashinfer-cubin": "prebuilt FlashInfer kernels; FlashInfer falls back to its JIT path, unused here",
    "tokenspeed-triton": "Triton fork for the TokenSpeed MLA kernels (DeepSeek models only)",
    "tokenspeed-mla": "MLA kernels for DeepSeek models",
    "nvidia-cutlass-dsl": "CuTe DSL, used by FlashInfer/quack kernels and DeepSeek V4's compressor",
    "nvidia-cutlass-dsl-libs-base": "CuTe DSL libraries",
    "nvidia-cutlass-dsl-libs-cu13": "CuTe DSL libraries",
    "quack-kernels": "CuTe DSL kernels",
    "nvidia-nvvm": "device compiler for JIT paths the test model does not take",
    "nvidia-cuda-nvcc": "device compiler for JIT paths the test model does not take",
    "nvidia-cuda-crt": "device compiler headers",
    "nvidia-cuda-tileiras": "cuTile compiler",
    "cuda-tile": "cuTile front end",
    "tilelang": "TileLang kernels (DeepSeek V4's hyper-connections)",
    "z3-solver": "TileLang dependency",
    "pynvvideocodec": "video decoding for multimodal inputs",
    "torchcodec": "video decoding for multimodal inputs",
    "opencv-python-headless": "image and video decoding for multimodal inputs, imported in functions only",
    "numba": "n-gram proposer only; not imported when serving (the machine has its own numba)",
    "llvmlite": "numba's compiler",
}

# What DeepSeek V4 needs on top (bench/vllm_backend/h200.sh serve-dsv4): its compressor and indexer run
# CuTe DSL kernels (with quack's), its hyper-connections TileLang kernels. `plan --deepseek-v4` stages them.
DEEPSEEK_V4 = frozenset(
    {
        "nvidia-cutlass-dsl",
        "nvidia-cutlass-dsl-libs-base",
        "nvidia-cutlass-dsl-libs-cu13",
        "quack-kernels",
        "tilelang",
        "z3-solver",
    }
)


def die(message: str) -> None:
    print(f"stage: {message}", file=sys.stderr)
    raise SystemExit(1)


# ---------------------------------------------------------------- plan and fetch (build side)


def plan(lock: Path, installed: Path, deepseek_v4: bool = False) -> dict:
    """Which locked wheels the GPU machine lacks at the locked version, and which it already has."""
    left_out = {k: v for k, v in NOT_STAGED.items() if not (deepseek_v4 and k in DEEPSEEK_V4)}
    wheels = json.loads(lock.read_text())["wheels"]
    have = {normalize_name(p["name"]): p["version"] for p in json.loads(installed.read_text())}
    stage, reuse, skipped = [], [], []
    for name, wheel in sorted(wheels.items()):
        entry = {"name": name, "version": wheel["version"], "filename": wheel["filename"]}
        if have.get(normalize_name(name)) == wheel["version"]:
            reuse.append(entry)
        elif normalize_name(name) in left_out:
            skipped.append({**entry, "reason": left_out[normalize_name(name)]})
        else:
            # A version-specific wheel (cp311) is replaced by the same release built for the machine's Python;
            # py3 and abi3 wheels travel as locked, sha256 included.
            entry["locked_sha256"] = wheel["sha256"]
            entry["same_file"] = not re.search(r"-cp3\d+-cp3\d+-", wheel["filename"])
            entry["installed_version"] = have.get(normalize_name(name))
            stage.append(entry)
    return {"lock": str(lock), "stage": stage, "reuse": reuse, "not_staged": skipped}


def fetch(plan_doc: dict, dest: Path, python_version: str, platforms: list[str]) -> list[Path]:
    """Download the planned wheels with pip (the index pip is configured with); locked files are checked."""
    dest.mkdir(parents=True, exist_ok=True)
    files = []
    for entry in plan_doc["stage"]:
        target = dest / entry["filename"]
        if entry["same_file"] and target.is_file() and sha256_file(target) == entry["locked_sha256"]:
            files.append(target)
            continue
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        command += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
        for platform in platforms:
            command += ["--platform", platform]
        command.append(f"{entry['name']}=={entry['version']}")
        subprocess.run(command, check=True)
        found = [
            p
            for p in dest.glob("*.whl")
            if (parse_wheel_filename(p.name).project, parse_wheel_filename(p.name).version)
            == (normalize_name(entry["name"]), entry["version"])
        ]
        if len(found) != 1:
            die(f"{entry['name']}=={entry['version']}: expected one wheel in {dest}, found {sorted(found)}")
        if entry["same_file"]:
            actual = sha256_file(found[0])
            if actual != entry["locked_sha256"]:
                die(
                    f"{found[0]}: sha256 mismatch: expected {entry['locked_sha256']} (locked), "
                    f"actual {actual}"
                )
        files.append(found[0])
    return files


# ---------------------------------------------------------------- delta of two wheels


_MAGIC = b"SSDELTA1"
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")


def _member_spans(path: Path) -> tuple[list[tuple[zipfile.ZipInfo, int, int]], int]:
    """(info, start of the local header, start of the compressed data) of every member, and the file size."""
    spans = []
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        for info in archive.infolist():
            raw.seek(info.header_offset)
            fields = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
            if fields[0] != b"PK\x03\x04":
                die(f"{path}: member {info.filename}: no local header at offset {info.header_offset}")
            data = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
            spans.append((info, info.header_offset, data))
    return spans, path.stat().st_size


def delta_make(base: Path, target: Path, out: Path) -> dict:
    """Ops that rebuild ``target`` from ``base``: copy the bytes of members both share, else literal."""
    base_members = {info.filename: (info, data) for info, _, data in _member_spans(base)[0]}
    spans, size = _member_spans(target)
    ops: list[tuple[str, int, int]] = []  # ("copy", base offset, length) or ("data", target offset, length)
    position = 0
    copied = 0
    with base.open("rb") as base_raw, target.open("rb") as target_raw:
        for info, _, data in sorted(spans, key=lambda span: span[1]):
            match = base_members.get(info.filename)
            if match is None or (match[0].CRC, match[0].compress_size, match[0].compress_type) != (
                info.CRC,
                info.compress_size,
                info.compress_type,
            ):
                continue
            base_raw.seek(match[1])
            target_raw.seek(data)
            if base_raw.read(info.compress_size) != target_raw.read(info.compress_size):
                continue
            if data > position:
                ops.append(("data", position, data - position))
            ops.append(("copy", match[1], info.compress_size))
            copied += info.compress_size
            position = data + info.compress_size
        if size > position:
            ops.append(("data", position, size - position))
        header = {
            "base_sha256": sha256_file(base),
            "target": target.name,
            "target_sha256": sha256_file(target),
            "target_size": size,
            "ops": [[kind, offset, length] for kind, offset, length in ops],
        }
        encoded = json.dumps(header, sort_keys=True).encode()
        tmp = out.with_name(out.name + ".tmp")
        with tmp.open("wb") as sink:
            sink.write(_MAGIC + struct.pack("<Q", len(encoded)) + encoded)
            for kind, offset, length in ops:
                if kind == "data":
                    target_raw.seek(offset)
                    sink.write(target_raw.read(length))
        tmp.replace(out)
    return {"target": target.name, "size": size, "copied": copied, "delta_size": out.stat().st_size}


def delta_apply(base: Path, delta: Path, out: Path) -> str:
    """Rebuild the target; refuses a base or a result whose sha256 is not the recorded one."""
    with delta.open("rb") as source:
        if source.read(len(_MAGIC)) != _MAGIC:
            die(f"{delta}: not a wheel delta (magic {_MAGIC.decode()} missing)")
        (length,) = struct.unpack("<Q", source.read(8))
        header = json.loads(source.read(length))
        actual = sha256_file(base)
        if actual != header["base_sha256"]:
            die(f"{base}: sha256 mismatch: expected {header['base_sha256']} (delta base), actual {actual}")
        tmp = out.with_name(out.name + ".tmp")
        digest = hashlib.sha256()
        with base.open("rb") as base_raw, tmp.open("wb") as sink:
            for kind, offset, size in header["ops"]:
                if kind == "copy":
                    base_raw.seek(offset)
                    block = base_raw.read(size)
                else:
                    block = source.read(size)
                if len(block) != size:
                    tmp.unlink()
                    die(f"{delta}: truncated ({kind} of {size} bytes at {offset})")
                digest.update(block)
                sink.write(block)
    if digest.hexdigest() != header["target_sha256"]:
        tmp.unlink()
        die(
            f"{out}: sha256 mismatch: expected {header['target_sha256']} (recorded), "
            f"actual {digest.hexdigest()}"
        )
    tmp.replace(out)
    return header["target_sha256"]


# ---------------------------------------------------------------- pack, receive, unpack


def pack(name: str, files: list[Path], out: Path, part_bytes: int) -> dict:
    """One tar stream of ``files`` cut into parts of at most ``part_bytes``, each in its own folder."""
    buffer = io.BytesIO()
    members = []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(files, key=lambda p: p.name):
            info = archive.gettarinfo(str(path), arcname=path.name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with path.open("rb") as stream:
                archive.addfile(info, stream)
            members.append({"name": path.name, "size": info.size, "sha256": sha256_file(path)})
    data = buffer.getvalue()
    parts = []
    for index, start in enumerate(range(0, len(data), part_bytes), start=1):
        folder = out / f"{name}-{index:02d}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        chunk = data[start : start + part_bytes]
        (folder / f"{name}.part{index:02d}").write_bytes(chunk)
        parts.append(
            {
                "file": f"{name}.part{index:02d}",
                "size": len(chunk),
                "sha256": hashlib.sha256(chunk).hexdigest(),
            }
        )
    manifest = {"name": name, "parts": parts, "members": members, "size": len(data)}
    for index in range(1, len(parts) + 1):
        (out / f"{name}-{index:02d}" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def receive(folders: list[Path], root: Path) -> list[str]:
    """Keep each arriving part whose sha256 is the manifest's; return the parts still missing."""
    missing: list[str] = []
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        target = root / manifest["name"]
        target.mkdir(parents=True, exist_ok=True)
        (target / "manifest.json").write_text(json.dumps(manifest))
        for part in manifest["parts"]:
            arrived = folder / part["file"]
            if arrived.is_file():
                actual = sha256_file(arrived)
                if actual != part["sha256"]:
                    die(f"{arrived}: sha256 mismatch: expected {part['sha256']}, actual {actual}")
                shutil.copyfile(arrived, target / part["file"])
                print(f"received {manifest['name']}/{part['file']} ({part['size']} bytes, sha256 ok)")
        missing = [
            part["file"]
            for part in manifest["parts"]
            if not (target / part["file"]).is_file() or (target / part["file"]).stat().st_size != part["size"]
        ]
    return missing


def unpack(name: str, root: Path, dest: Path) -> list[Path]:
    """Reassemble the parts, extract the wheels and check each one's sha256."""
    folder = root / name
    manifest = json.loads((folder / "manifest.json").read_text())
    missing = [part["file"] for part in manifest["parts"] if not (folder / part["file"]).is_file()]
    if missing:
        die(f"{folder}: parts missing: {', '.join(missing)}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as stream:
        for part in manifest["parts"]:
            with (folder / part["file"]).open("rb") as source:
                shutil.copyfileobj(source, stream)
        stream.seek(0)
        with tarfile.open(fileobj=stream, mode="r") as archive:
            # Only the flat regular files ``pack`` wrote; anything else is refused rather than extracted.
            for member in archive:
                if not member.isfile() or "/" in member.name or member.name in ("", ".", ".."):
                    die(f"{folder}: unexpected tar member {member.name!r}")
                source = archive.extractfile(member)
                assert source is not None
                with (dest / member.name).open("wb") as sink:
                    shutil.copyfileobj(source, sink)
    out = []
    for member in manifest["members"]:
        path = dest / member["name"]
        actual = sha256_file(path)
        if actual != member["sha256"]:
            die(f"{path}: sha256 mismatch: expected {member['sha256']}, actual {actual}")
        out.append(path)
    print(f"unpacked {name}: {len(out)} files, sha256 ok")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("plan")
    p.add_argument(
        "--lock", type=Path, default=Path("third_party/python/requirements_linux_x86_64.files.json")
    )
    p.add_argument(
        "--installed", type=Path, required=True, help="`pip list --format=json` of the GPU machine"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deepseek-v4", action="store_true", help="also stage what DeepSeek V4 needs")
    f = commands.add_parser("fetch")
    f.add_argument("--plan", type=Path, required=True)
    f.add_argument("--dir", type=Path, required=True)
    f.add_argument("--python-version", default="3.12")
    f.add_argument(
        "--platform",
        action="append",
        default=None,
        help="wheel platform tags the GPU machine accepts (default: manylinux 2.17 to 2.39, x86_64)",
    )
    d = commands.add_parser("delta")
    d.add_argument("action", choices=("make", "apply"))
    d.add_argument("--base", type=Path, required=True)
    d.add_argument("--target", type=Path)
    d.add_argument("--delta", type=Path)
    d.add_argument("--out", type=Path, required=True)
    k = commands.add_parser("pack")
    k.add_argument("--name", required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("--part-mib", type=int, default=60)
    k.add_argument("files", nargs="+", type=Path)
    r = commands.add_parser("receive")
    r.add_argument("folders", nargs="+", type=Path)
    r.add_argument("--root", type=Path, default=STAGE_ROOT)
    u = commands.add_parser("unpack")
    u.add_argument("name")
    u.add_argument("--root", type=Path, default=STAGE_ROOT)
    u.add_argument("--dest", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.command == "plan":
        doc = plan(args.lock, args.installed, args.deepseek_v4)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"stage {len(doc['stage'])}, reuse {len(doc['reuse'])}, not staged {len(doc['not_staged'])}")
    elif args.command == "fetch":
        platforms = args.platform or [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + [
            "manylinux2014_x86_64",
            "manylinux1_x86_64",
        ]
        files = fetch(json.loads(args.plan.read_text()), args.dir, args.python_version, platforms)
        print(f"{len(files)} wheels, {sum(p.stat().st_size for p in files)} bytes in {args.dir}")
    elif args.command == "delta" and args.action == "make":
        if args.target is None:
            parser.error("delta make needs --target")
        print(json.dumps(delta_make(args.base, args.target, args.out)))
    elif args.command == "delta":
        if args.delta is None:
            parser.error("delta apply needs --delta")
        print(f"{args.out}: sha256 {delta_apply(args.base, args.delta, args.out)} (as recorded)")
    elif args.command == "pack":
        manifest = pack(args.name, args.files, args.out, args.part_mib << 20)
        print(
            f"{args.name}: {len(manifest['members'])} files, {manifest['size']} bytes, "
            f"{len(manifest['parts'])} parts"
        )
    elif args.command == "receive":
        missing = receive(args.folders, args.root)
        print("complete" if not missing else f"still missing: {', '.join(missing)}")
    else:
        unpack(args.name, args.root, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
