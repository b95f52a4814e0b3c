#!/usr/bin/env bash
# Jobs on a GPU machine that outlive one remote command (run from the repository root there).
#
# A remote command may run for a bounded time, and a DeepSeek V4 server's first start on a fresh machine
# (vLLM's warm-up JIT-compiles FlashInfer, TileLang and Triton kernels) takes most of it. So the runs are
# started as a job in a session of their own, which survives the command that started it, and later
# commands wait for it and collect what it wrote:
#   bench/live/device.sh start NAME COMMAND...   start COMMAND as job NAME (setsid; log, pid and exit status
#                                                under /tmp/sparkseal-jobs/NAME)
#   bench/live/device.sh wait NAME SECONDS       wait up to SECONDS for job NAME; exit 0 when it ended (its own
#                                                status printed), 3 while it still runs; the log's tail either way
#   bench/live/device.sh caches OUT [MIB]        the warm-up's compile caches (FlashInfer, Triton, TileLang,
#                                                vLLM's torch.compile, TVM FFI, CUDA's, Inductor's) as
#                                                OUT/caches.tar.xz.NN, parts of MIB (default 15) of one stream,
#                                                and OUT/caches.txt (each cache's size)
#   bench/live/device.sh restore DIR             unpack the caches.tar.xz.NN parts in DIR where they were, before
#                                                a server starts
set -euo pipefail

jobs=/tmp/sparkseal-jobs
# Where the warm-up's compilers keep their results: FlashInfer's JIT, Triton, TileLang, vLLM's
# torch.compile cache, Inductor's, and the driver's PTX cache.
cache_dirs=(.cache/flashinfer .triton/cache .tilelang .cache/vllm .cache/tvm-ffi .nv/ComputeCache)

case "${1:-}" in
start)
    name=$2
    shift 2
    mkdir -p "$jobs/$name"
    rm -f "$jobs/$name/rc"
    # setsid: the job is in a session of its own, so the end of this command does not end it. The inner
    # script expands its own arguments (the job folder, the working directory, the command), hence the
    # single quotes.
    # shellcheck disable=SC2016
    setsid bash -c 'dir=$1; cd "$2"; shift 2; "$@" >"$dir/log" 2>&1; echo $? >"$dir/rc"' \
        _ "$jobs/$name" "$PWD" "$@" </dev/null >/dev/null 2>&1 &
    echo $! >"$jobs/$name/pid"
    echo "device: job $name started (pid $(cat "$jobs/$name/pid"))"
    ;;
wait)
    name=$2
    seconds=$3
    [ -d "$jobs/$name" ] || { echo "device: no job $name" >&2; exit 2; }
    end=$((SECONDS + seconds))
    while [ ! -f "$jobs/$name/rc" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    tail -n 80 "$jobs/$name/log"
    if [ -f "$jobs/$name/rc" ]; then
        echo "device: job $name ended with status $(cat "$jobs/$name/rc")"
        exit 0
    fi
    echo "device: job $name still running after ${seconds} s"
    exit 3
    ;;
caches)
    out=$2
    mib=${3:-15}
    mkdir -p "$out"
    present=()
    : >"$out/caches.txt"
    for dir in "${cache_dirs[@]/#/$HOME/}" /tmp/torchinductor_*; do
        if [ -d "$dir" ]; then
            present+=("${dir#/}")
            du -sb "$dir" >>"$out/caches.txt"
        fi
    done
    cat "$out/caches.txt"
    if [ ${#present[@]} -gt 0 ]; then
        # One xz stream of one tar (paths from /), cut into parts (the transfer limits files, not streams).
        tar -C / -cf - "${present[@]}" | xz -T0 -6 | split -b "${mib}M" -d -a 2 - "$out/caches.tar.xz."
        ls -l "$out"/caches.tar.xz.*
    fi
    ;;
restore)
    dir=$2
    parts=("$dir"/caches.tar.xz.[0-9][0-9])
    [ -e "${parts[0]}" ] || { echo "device: no cache parts in $dir" >&2; exit 2; }
    cat "${parts[@]}" | xz -d | tar -C / -xf -
    echo "device: caches restored from ${#parts[@]} parts"
    ;;
*)
    echo "usage: $0 start NAME COMMAND... | wait NAME SECONDS | caches OUT [MIB] | restore DIR" >&2
    exit 2
    ;;
esac
