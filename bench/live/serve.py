"""Serve the test model with a staged vLLM, run ``sparkseal live-check`` on it, stop it (GPU machine side).

One invocation is one server: it starts ``vllm serve`` from the given site folders (ahead of the machine's
own packages on PYTHONPATH), waits for ``/health`` while watching the process, runs each live-check given
with ``--check`` against it, and stops the server by pid. Every report, the server log and a summary land
in ``--out``. Standard library only; run from the repository root.

    python3 bench/live/serve.py --name ours-dspark-seqs1 --site /tmp/s/ours --site /tmp/s/deps \\
        --model-dir /tmp/sparkseal-model --dspark --max-num-seqs 1 --out $OUT \\
        --check "ours-dspark-seqs1:--concurrency 1 --against $OUT/reference.json"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVED_NAME = "sparkseal-test"
NUM_SPECULATIVE_TOKENS = 5


def serve_command(args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(args.model_dir / "target")]
    command += ["--served-model-name", SERVED_NAME, "--skip-tokenizer-init"]
    command += ["--load-format", args.load_format]
    command += ["--host", "127.0.0.1", "--port", str(args.port), "--max-model-len", str(args.max_model_len)]
    command += ["--max-num-seqs", str(args.max_num_seqs), "--gpu-memory-utilization", "0.4", "--seed", "0"]
    command += ["--enable-chunked-prefill", "--enable-prefix-caching"]
    command += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    command += ["--compilation-config", json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"})]
    command += args.vllm_arg
    if args.dspark:
        speculative = {
            "method": "dspark",
            "model": str(args.model_dir / "draft"),
            "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        }
        if args.draft_sample_method is not None:
            speculative["draft_sample_method"] = args.draft_sample_method
        if args.draft_attention_backend is not None:
            # vLLM builds the draft with this backend, not the target's --attention-backend
            # (vllm/v1/worker/gpu/spec_decode/dspark/utils.py); unset, vLLM chooses.
            speculative["attention_backend"] = args.draft_attention_backend
        command += ["--speculative-config", json.dumps(speculative)]
    return command


def python_path(sites: list[Path]) -> list[Path]:
    """The site folders and the folders their ``.pth`` files name, in order (``pip --target`` trees are
    not site directories, so Python would not read those files; CuTe DSL installs its package so)."""
    found: list[Path] = []
    for site in sites:
        found.append(site)
        for pth in sorted(site.glob("*.pth")):
            for line in pth.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "import ")) and (site / line).is_dir():
                    found.append(site / line)
    return found


def wait_healthy(process: subprocess.Popen, port: int, deadline: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited with status {process.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vllm serve was not healthy within {deadline:g} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True)
    parser.add_argument("--site", action="append", type=Path, required=True, help="site folder, first wins")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--dspark", action="store_true")
    parser.add_argument(
        "--draft-attention-backend",
        help="with --dspark: the draft's attention backend (the speculative config's attention_backend)",
    )
    parser.add_argument(
        "--draft-sample-method",
        choices=("greedy", "probabilistic"),
        help="with --dspark: the speculative config's draft_sample_method (unset: vLLM's default)",
    )
    parser.add_argument("--load-format", choices=("dummy", "safetensors"), default="dummy")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--nccl-logs", type=Path, help="write each rank's NCCL debug log (INIT and COLL) into this folder"
    )
    parser.add_argument("--vllm-arg", action="append", default=[], help="one more argument of vllm serve")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server's environment")
    parser.add_argument("--start-deadline", type=float, default=420.0)
    parser.add_argument(
        "--check",
        action="append",
        default=[],
        help="NAME:LIVE-CHECK-ARGUMENTS ({pid} there is the server's process id, for --teardown-pid)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / f"{args.name}.server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(path) for path in python_path(args.site))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(item.split("=", 1) for item in args.env)
    env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off: it can take a shared host's GPUs down
    if args.nccl_logs is not None:
        args.nccl_logs.mkdir(parents=True, exist_ok=True)
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT,COLL"
        env["NCCL_DEBUG_FILE"] = str(args.nccl_logs / "nccl.%h.%p.log")
    command = serve_command(args)
    summary: dict = {"name": args.name, "command": shlex.join(command), "checks": {}}
    started = time.monotonic()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp", start_new_session=True
        )
    try:
        summary["startup_s"] = round(wait_healthy(process, args.port, args.start_deadline), 1)
        print(f"{args.name}: healthy after {summary['startup_s']} s", flush=True)
        for check in args.check:
            check_name, _, check_args = check.partition(":")
            report_path = args.out / f"{check_name}.json"
            live = [sys.executable, "-m", "sparkseal", "live-check", f"http://127.0.0.1:{args.port}"]
            arguments = shlex.split(check_args.replace("{pid}", str(process.pid)))
            live += [*arguments, "--log", str(log_path), "--json"]
            check_env = dict(os.environ, PYTHONPATH=str(REPO))
            t0 = time.monotonic()
            result = subprocess.run(live, env=check_env, capture_output=True, text=True, cwd=REPO)
            report_path.write_text(result.stdout)
            summary["checks"][check_name] = {
                "exit": result.returncode,
                "seconds": round(time.monotonic() - t0, 1),
                "arguments": check_args,
            }
            print(
                f"{check_name}: live-check exit {result.returncode} "
                f"({summary['checks'][check_name]['seconds']} s)"
            )
            if result.stderr.strip():
                print(result.stderr.strip()[-2000:])
    except RuntimeError as error:
        summary["error"] = str(error)
        print(f"{args.name}: {error}", flush=True)
        print(log_path.read_text()[-6000:])
    finally:
        stop(process)
        summary["total_s"] = round(time.monotonic() - started, 1)
        (args.out / f"{args.name}.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    failed = [name for name, check in summary["checks"].items() if check["exit"] != 0]
    if failed:  # a failed check fails the server's run, as a server that never came up does
        print(f"{args.name}: live-check failed: {', '.join(failed)}", flush=True)
    return 1 if "error" in summary or failed else 0


if __name__ == "__main__":
    sys.exit(main())
