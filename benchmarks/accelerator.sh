#!/usr/bin/env bash
# The accelerator run (batched frames), prepared so that it fits a short
# loan of an NVIDIA machine with no network (docs/performance.md, "On an accelerator").
#
#   benchmarks/accelerator.sh prepare
#       Here, with the package index reachable: the wheels the machine lacks (MLX's
#       CUDA backend, mlx-vlm, mlx-audio, the server's own dependencies; the versions
#       this checkout's .venv holds) for Python 3.12 on x86-64 Linux, packed into parts
#       of at most 60 MiB under .accelerator/1, .accelerator/2, ... (git-ignored): one
#       device call carries 64 MiB at most.
#   benchmarks/accelerator.sh pack           (prepare's second half: .accelerator/wheels
#       packed into the parts)
#   benchmarks/accelerator.sh stash          (on the device, carrying .accelerator/N)
#       Keeps part N in /tmp/accelerator; the machine keeps /tmp while it stays warm,
#       so the calls must follow each other at once.
#   benchmarks/accelerator.sh join           (the first step of run, on its own)
#       Joins the stashed parts, checks them against prepare's digest, unpacks them.
#   benchmarks/accelerator.sh run [SECONDS]  (on the device, carrying the last part)
#       Joins and checks the parts, installs the wheels into /tmp/site, then, within
#       ACCELERATOR_BUDGET seconds (480): a tiny smoke (both steps, B = 1 and 8; a
#       failure stops the run), the deep checkpoint's exact counts (benchmarks.graph),
#       the ``full`` checkpoint (the real model's dimensions, 4-bit) built, its step per
#       batch size against mlx-vlm's, where batched rows stop being their solo runs'
#       bits (benchmarks.lastbits), the conversations one server keeps in real time, and
#       the capacity curve (benchmarks.capacity: capacity.json and capacity.png).
#       Prints one screen of figures (screen.txt); everything lands in $OUT.
#       SECONDS (default 10) is each conversation count's run in the sessions sweep and
#       the capacity curve. The device image has matplotlib (KINDS.md), for the plot.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
HERE=.accelerator
STASH=${ACCELERATOR_STASH:-/tmp/accelerator}
PART_BYTES=${ACCELERATOR_PART_BYTES:-56m}
PYTHON_VERSION=${ACCELERATOR_PYTHON:-3.12}
# MLX's backend wheel, and the preset the run builds. A dry run on a CPU machine sets
# ACCELERATOR_PYTHON to its python3's version, ACCELERATOR_MLX_BACKEND=mlx-cpu and
# ACCELERATOR_SIZE=tiny (docs/performance.md).
MLX_BACKEND=${ACCELERATOR_MLX_BACKEND:-mlx-cuda-13}
SIZE=${ACCELERATOR_SIZE:-full}
PLATFORMS=(manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_28_x86_64
    manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
# What the device image lacks (KINDS.md lists what it has: numpy, transformers,
# tokenizers, safetensors, huggingface-hub, attrs, prometheus-client, jinja2, click,
# werkzeug, sentencepiece, scipy, h11, ... and CUDA 13's libraries). Each is pinned to
# the version this checkout's .venv holds, so the device runs what the tests ran.
CARRY=(mlx mlx-vlm mlx-audio trio trio-websocket outcome sniffio quart quart-trio
    hypercorn h2 hpack hyperframe priority wsproto blinker itsdangerous flask
    soundfile cffi pycparser soxr platformdirs miniaudio)

prepare() {
    local venv=.venv/bin/python pins=() name version
    for name in "${CARRY[@]}"; do
        version=$("$venv" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
        pins+=("$name==$version")
    done
    version=$("$venv" -c "import importlib.metadata as m; print(m.version('mlx'))")
    pins+=("$MLX_BACKEND==$version")
    rm -rf "$HERE"
    mkdir -p "$HERE/wheels"
    local flags=(--no-deps --only-binary=:all: --python-version "$PYTHON_VERSION"
        --implementation cp --abi "cp${PYTHON_VERSION/./}" --abi abi3 --abi none)
    for platform in "${PLATFORMS[@]}"; do flags+=(--platform "$platform"); done
    "$venv" -m pip download -q "${flags[@]}" -d "$HERE/wheels" "${pins[@]}"
    pack
}

pack() {
    # $HERE/wheels as one tar, its digest, and parts of PART_BYTES, each in a folder.
    rm -rf "$HERE"/[0-9]*/
    tar -cf "$HERE/wheels.tar" -C "$HERE" wheels
    (cd "$HERE" && sha256sum wheels.tar > wheels.sha256 && split -b "$PART_BYTES" -d -a 1 wheels.tar part-)
    local count number=0 part
    count=$(ls "$HERE"/part-* | wc -l)
    for part in "$HERE"/part-*; do
        number=$((number + 1))
        mkdir -p "$HERE/$number"
        mv "$part" "$HERE/$number/part"
        cp "$HERE/wheels.sha256" "$HERE/$number/"
        echo "$number" > "$HERE/$number/number"
        echo "$count" > "$HERE/$number/count"
    done
    rm -rf "$HERE/wheels" "$HERE/wheels.tar"
    echo "$count parts:"
    du -sh "$HERE"/*/
    echo "then, on the device, one call per part, back to back:"
    for ((part = 1; part < count; part++)); do
        echo "  carry [\"$HERE/$part\"]: bash benchmarks/accelerator.sh stash"
    done
    echo "  carry [\"$HERE/$count\"]: bash benchmarks/accelerator.sh run"
}

stash() {
    # Every part this call carried (and any an earlier call left in the checkout).
    local dir found=0
    mkdir -p "$STASH"
    for dir in "$HERE"/[0-9]*/; do
        [[ -f "$dir/part" ]] || continue
        found=1
        cp "$dir/part" "$STASH/part-$(cat "$dir/number")"
        cp "$dir/wheels.sha256" "$dir/count" "$STASH/"
    done
    [[ $found == 1 || -f "$STASH/count" ]] || {
        echo "no part here: carry one of .accelerator/N (benchmarks/accelerator.sh prepare makes them)" >&2
        exit 2
    }
    ls -la "$STASH"
}

join() {
    # Every part stashed, joined, checked against the digest prepare wrote, unpacked.
    stash > /dev/null
    local count number
    count=$(cat "$STASH/count")
    for ((number = 1; number <= count; number++)); do
        [[ -f "$STASH/part-$number" ]] || {
            echo "part $number of $count is missing: carry .accelerator/$number in a stash call first" >&2
            exit 2
        }
    done
    (cd "$STASH" && for ((number = 1; number <= count; number++)); do cat "part-$number"; done \
        > wheels.tar && sha256sum -c wheels.sha256)
    rm -rf "$STASH/wheels"
    tar -xf "$STASH/wheels.tar" -C "$STASH"
}

run() {
    # Everything within BUDGET seconds (default 480: an 8-minute run leaves a 15-minute
    # loan room for its start and a second try): a tiny smoke first (it stops the run
    # when the install or the backend is broken), the deep checkpoint's exact counts,
    # then the full checkpoint; each later stage gets what is left, or is skipped.
    local seconds=${1:-10} out=${OUT:-/tmp/accelerator-out} budget=${ACCELERATOR_BUDGET:-480}
    local started=$SECONDS
    mkdir -p "$out"
    : > "$out/summary.txt"
    note() { echo "$*" | tee -a "$out/summary.txt"; }
    stage() {
        # stage NAME NEED COMMAND...: COMMAND with the seconds left (at least NEED), its
        # output in NAME.log.
        local name=$1 need=$2 left
        shift 2
        left=$((budget - (SECONDS - started)))
        if ((left < need)); then
            note "$name: skipped, ${left} s of the budget left (needs ${need})"
            return 1
        fi
        local begun=$SECONDS code=0
        timeout "$left" "$@" > "$out/$name.log" 2>&1 || code=$?
        note "$name: exit $code after $((SECONDS - begun)) s"
        return "$code"
    }
    join
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$STASH"/wheels/*.whl
    # libmlx.so finds CUDA's libraries through RPATH $ORIGIN/../../nvidia/*/lib, i.e. in
    # its own site-packages: point that at the image's (PyTorch's cu13 wheels), and put
    # them on the loader's path too.
    local nvidia
    if nvidia=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null); then
        [[ -e /tmp/site/nvidia ]] || ln -s "$nvidia" /tmp/site/nvidia
        LD_LIBRARY_PATH=$(find "$nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
        export LD_LIBRARY_PATH
    fi
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 REALTIME_CACHE_DIR=/tmp/accelerator-cache
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
        python3 -c "import platform, mlx.core as mx, importlib.metadata as m; \
print(platform.python_version(), mx.default_device(), \
{n: m.version(n) for n in ('mlx', '$MLX_BACKEND', 'mlx-vlm', 'mlx-audio', 'numpy')}); \
a = mx.ones((1024, 1024)); mx.eval(a @ a); print('a matmul ran on', mx.default_device())"
        lscpu | grep -E 'Model name|^CPU\(s\)' || true
    } 2>&1 | tee "$out/machine.txt"
    # 1. Smoke: the tiny checkpoint through both steps, B = 1 and 8.
    local tiny=/tmp/accelerator-tiny
    if ! stage smoke 30 sh -c "python3 -m realtime demo-model $tiny && python3 -m benchmarks.batching \
            --model $tiny --batch 1,8 --rounds 1 --warmup 2 --frames 5 --json $out/smoke.json"; then
        tail -n 30 "$out/smoke.log"
        exit 1
    fi
    # 2. The exact counts on deep (the real model's graph; host ms here are the GPU's).
    stage graph 60 python3 -m benchmarks.graph --size deep --json "$out/graph.json" || true
    # 3. The full checkpoint: build, the step per batch size, the last bits, the sessions.
    local model=/tmp/accelerator-$SIZE-4bit
    if stage build 150 python3 -m realtime demo-model "$model" --size "$SIZE" --quantize 4; then
        stage batching 90 python3 -m benchmarks.batching --model "$model" --batch 1,8,32 \
            --rounds 1 --warmup 3 --frames 8 --json "$out/batching.json" || true
        stage lastbits 60 python3 -m benchmarks.lastbits --model "$model" --batch 2,8,16,32 \
            --frames 4 --json "$out/lastbits.json" || true
        stage sessions $((3 * seconds + 40)) python3 -m benchmarks.sessions --model "$model" \
            --sessions 1,16,32 --scheduler batched --seconds "$seconds" --rounds 1 \
            --json "$out/sessions.json" || true
        # The capacity curve (docs/performance.md): 1, 2, 4, ... conversations until one
        # falls behind, mlx-vlm's server at one beside it, plotted to capacity.png. It
        # starts no count past its budget, which keeps 120 s for mlx-vlm's row.
        local left=$((budget - (SECONDS - started)))
        stage capacity $((2 * seconds + 150)) python3 -m benchmarks.capacity --model "$model" \
            --seconds "$seconds" --max-sessions 64 --budget-seconds $((left - 120)) \
            --json "$out/capacity.json" --plot "$out/capacity.png" || true
    fi
    # One screen: what ran, then each stage's figures.
    {
        echo "== $(head -n 1 "$out/machine.txt"); $(sed -n 3p "$out/machine.txt")"
        cat "$out/summary.txt"
        for name in smoke batching; do
            [[ -f "$out/$name.log" ]] && grep -E '^  (mlx-vlm|ours)' "$out/$name.log" | sed "s/^/$name /"
        done
        [[ -f "$out/graph.log" ]] && grep -E '^(model|deep) ' "$out/graph.log"
        [[ -f "$out/lastbits.log" ]] && grep -E '^B=' "$out/lastbits.log"
        [[ -f "$out/sessions.json" ]] && python3 -c "import json, sys; \
print('largest N in real time:', json.load(open(sys.argv[1]))['max_realtime_sessions'])" \
            "$out/sessions.json"
        [[ -f "$out/capacity.log" ]] && grep -E '^(ours|mlx-vlm|largest|stopped)' "$out/capacity.log"
        echo "== $((SECONDS - started)) s of a ${budget} s budget"
    } 2>&1 | tee "$out/screen.txt"
}

case "${1:-}" in
    prepare) prepare ;;
    pack) pack ;;
    stash) stash ;;
    join) join ;;
    run) shift; run "$@" ;;
    *) echo "usage: benchmarks/accelerator.sh prepare | pack | stash | join | run [SECONDS]" >&2; exit 2 ;;
esac
