#!/usr/bin/env bash
# The container image, offline: builds the root Dockerfile with podman (Debian's
# package; .ci/run installs it) from a Debian rootfs made with debootstrap and
# `podman import` (no registry is reachable here, so no base image can be
# pulled) and the already-built binaries (BINARIES=prebuilt), then runs the
# router from the image against the simulator on the host's loopback
# (--network host) and routes one request through it.
#
#   tests/container_image.sh        # after `cargo build` (or `cargo test`)
#
# Env: WARMPATH_IMAGE_BIN_DIR (default target/debug), the binaries to ship;
# WARMPATH_DEBIAN_MIRROR (default http://deb.debian.org/debian). Skips loudly
# (exit 0) without podman or debootstrap, fails instead under
# WARMPATH_REQUIRE_TOOLS=1 (as .ci/run sets); a build or run failure fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN_DIR=${WARMPATH_IMAGE_BIN_DIR:-$ROOT/target/debug}
MIRROR=${WARMPATH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=localhost/warmpath-test-base:bookworm
IMAGE=localhost/warmpath:test
MODEL=warmpath-tiny

for tool in podman debootstrap curl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    if [ "${WARMPATH_REQUIRE_TOOLS:-}" = 1 ]; then
      echo "FAILED: $tool is not installed and WARMPATH_REQUIRE_TOOLS=1: the container image cannot be tested" >&2
      exit 1
    fi
    echo "SKIPPED: $tool is not installed; the container image is NOT TESTED" >&2
    exit 0
  fi
done

WORK=$(mktemp -d /tmp/warmpath-image.XXXXXX)
SIM_PID=
CID=
cleanup() {
  [ -n "$CID" ] && podman rm -f "$CID" >/dev/null 2>&1 || true
  [ -n "$SIM_PID" ] && kill -INT "$SIM_PID" 2>/dev/null && wait "$SIM_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
t() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(t)" 'BEGIN { printf "%.1f", b - a }'; }

# Some sandboxes (a VM without CAP_SYS_RESOURCE and with hybrid cgroups, like
# the one this was written on) refuse crun's cgroup setup and any setrlimit:
# there, runc without default ulimits runs the same image. Say which was used.
RUN_OPTS=()
probe_runtime() {
  if podman run --rm --network host "$BASE" /bin/true >/dev/null 2>"$WORK/run.err"; then
    return
  fi
  echo "== podman run failed with the defaults ($(tail -1 "$WORK/run.err")); retrying with runc and no default ulimits"
  printf '[containers]\ndefault_ulimits = []\n' >"$WORK/containers.conf"
  export CONTAINERS_CONF=$WORK/containers.conf
  RUN_OPTS=(--runtime runc)
  podman "${RUN_OPTS[@]}" run --rm --network host "$BASE" /bin/true
}

start=$(t)
if ! podman image exists "$BASE"; then
  echo "== debootstrap bookworm (minbase) from $MIRROR"
  debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; exit 1; }
  tar -C "$WORK/rootfs" -c . | podman import - "$BASE" >/dev/null
  rm -rf "$WORK/rootfs"
fi
echo "== base image $BASE: $(since "$start") s"

start=$(t)
mkdir -p "$WORK/ctx/bin"
cp "$BIN_DIR/warmpath-router" "$BIN_DIR/warmpath-agent" "$WORK/ctx/bin/"
podman build -q -f Dockerfile -t "$IMAGE" \
  --build-arg BASE_IMAGE="$BASE" --build-arg BINARIES=prebuilt "$WORK/ctx" >/dev/null
echo "== podman build (BINARIES=prebuilt from $BIN_DIR): $(since "$start") s"
[ "$(podman image inspect -f '{{.Config.User}}' "$IMAGE")" = "65532:65532" ] || { echo "FAIL: image user is not 65532:65532"; exit 1; }
podman image inspect -f '{{.Config.Entrypoint}}' "$IMAGE" | grep -q warmpath-router \
  || { echo "FAIL: entrypoint is not warmpath-router"; exit 1; }

probe_runtime
start=$(t)
podman "${RUN_OPTS[@]}" run --rm "$IMAGE" --version | grep -q '^warmpath-router '
podman "${RUN_OPTS[@]}" run --rm --entrypoint warmpath-agent "$IMAGE" --version | grep -q '^warmpath-agent '
[ "$(podman "${RUN_OPTS[@]}" run --rm --entrypoint /usr/bin/id "$IMAGE" -u)" = 65532 ] \
  || { echo "FAIL: the container does not run as uid 65532"; exit 1; }

"$ROOT/target/debug/warmpath-bench" sim --instances 1 --model "$MODEL" >"$WORK/sim.out" 2>"$WORK/sim.err" &
SIM_PID=$!
for _ in $(seq 100); do grep -q ' kv-events ' "$WORK/sim.out" && break; sleep 0.1; done
ENGINE=$(awk '/ kv-events /{for (i = 1; i < NF; i++) if ($i == "http") print $(i + 1)}' "$WORK/sim.out")
[ -n "$ENGINE" ] || { cat "$WORK/sim.out" "$WORK/sim.err"; echo "FAIL: the simulator did not start"; exit 1; }
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

CID=$(podman "${RUN_OPTS[@]}" run -d --network host "$IMAGE" \
  --listen "127.0.0.1:$PORT" --model "$MODEL" --strategy least_outstanding --backend "$ENGINE" --drain-grace-ms 100)
ready=
for _ in $(seq 200); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$PORT/readyz" 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
[ -n "$ready" ] || { podman logs "$CID"; echo "FAIL: the router in the image never became ready"; exit 1; }
curl -fsS -D "$WORK/headers" -o "$WORK/body" "http://127.0.0.1:$PORT/v1/chat/completions" \
  -H 'content-type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"hello from the image\"}], \"max_tokens\": 4}"
grep -qi "^x-warmpath-backend: $ENGINE" "$WORK/headers" || { cat "$WORK/headers"; echo "FAIL: not routed to $ENGINE"; exit 1; }
python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]' "$WORK/body"
podman stop -t 10 "$CID" >/dev/null
[ "$(podman inspect -f '{{.State.ExitCode}}' "$CID")" = 0 ] || { podman logs "$CID"; echo "FAIL: the router did not exit 0 on SIGTERM"; exit 1; }
echo "== run the image against the sim, one request routed, SIGTERM exit 0: $(since "$start") s"
echo "PASS container_image (runtime: ${RUN_OPTS[*]:-podman defaults})"
