#!/usr/bin/env bash
# warmpath-engine GPU check (issue 6): build with candle's CUDA backend, then
# measure TTFT cold vs warm for an 8000-token shared prefix on a random-weight
# Llama of about 1B parameters (Llama 3.2 1B's shape, `--size 1b`, bf16), and
# print ONE JSON line (also written to $OUT/gpu-check.json when $OUT is set).
#
# Needs: an NVIDIA GPU, the CUDA toolkit (nvcc, for candle's kernels) and a Rust
# toolchain; the crates must already be in $CARGO_HOME (the machine may be
# offline: the build runs with --offline unless CARGO_OFFLINE=0).
#
#   crates/warmpath-engine/scripts/gpu-check.sh          # build + run
#   crates/warmpath-engine/scripts/gpu-check.sh build    # build only (slow: kernels)
#   crates/warmpath-engine/scripts/gpu-check.sh run      # run only (after build)
#
# Overrides (env): FEATURES (cuda), DEVICE (cuda), DTYPE (bf16), SIZE (1b),
# PREFIX (8000), SUFFIX (32), RUNS (3), CHUNK (2048), CUDA_COMPUTE_CAP (90 = H100/H200),
# CARGO_TARGET_DIR (target-gpu). E.g. a CPU dry run of the script itself:
#   FEATURES= DEVICE=cpu DTYPE=f32 SIZE=tiny PREFIX=500 RUNS=1 scripts/gpu-check.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."   # the workspace root

FEATURES="${FEATURES-cuda}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bf16}"
SIZE="${SIZE:-1b}"
PREFIX="${PREFIX:-8000}"
SUFFIX="${SUFFIX:-32}"
RUNS="${RUNS:-3}"
CHUNK="${CHUNK:-2048}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-gpu}"
step="${1:-all}"

offline=(--offline)
[ "${CARGO_OFFLINE:-1}" = 0 ] && offline=()
features=()
[ -n "$FEATURES" ] && features=(--features "$FEATURES")
bench="$CARGO_TARGET_DIR/release/warmpath-engine-bench"

if [ "$step" = all ] || [ "$step" = build ]; then
    if [ -n "$FEATURES" ]; then
        command -v nvcc >/dev/null || { echo "gpu-check: nvcc not found (CUDA toolkit needed to build the cuda feature)" >&2; exit 2; }
        nvcc --version | tail -n 1 >&2
    fi
    command -v cargo >/dev/null || { echo "gpu-check: cargo not found" >&2; exit 2; }
    start=$(date +%s)
    cargo build --release "${offline[@]}" -p warmpath-engine --bin warmpath-engine-bench "${features[@]}" >&2
    echo "gpu-check: built in $(( $(date +%s) - start )) s" >&2
fi

if [ "$step" = all ] || [ "$step" = run ]; then
    [ -x "$bench" ] || { echo "gpu-check: $bench missing; run the build step first" >&2; exit 2; }
    gpu="none"
    if command -v nvidia-smi >/dev/null; then
        gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
    fi
    result="$("$bench" --size "$SIZE" --device "$DEVICE" --dtype "$DTYPE" --prefix "$PREFIX" \
        --suffix "$SUFFIX" --runs "$RUNS" --prefill-chunk "$CHUNK" --json)"
    line="{\"gpu\":\"${gpu//\"/}\",\"bench\":$result}"
    echo "$line"
    if [ -n "${OUT:-}" ]; then
        echo "$line" > "$OUT/gpu-check.json"
    fi
fi
