"""Prints the `warmpath-agent` flags that match a `vllm serve` command line.

    python -m warmpath_router.vllm [--worker-id ID | --k8s] [--router URL ...] -- \\
        vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 \\
        --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
          "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'

It reads the served model name (`--served-model-name`, else the model), the
port, the KV-event publisher and replay endpoints (a wildcard bind such as
`tcp://*:5557` becomes `tcp://127.0.0.1:5557` for the agent beside the
engine), the topic, the data-parallel ranks and the block size (which the
router's pool must equal), and says what cannot work: KV events off or a
non-zmq publisher (then it says how to turn them on, and prints the flags for
that), a publisher vLLM would connect instead of bind, prefix caching off. Notes go to stderr; `--json` prints
`{"args": [...], "block_size": N, "notes": [...]}` instead of a command.
"""

import argparse
import json
import shlex
import socket
import sys

WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")
# vLLM's defaults (vllm/config/kv_events.py, vllm serve).
DEFAULT_PORT = 8000
DEFAULT_ENDPOINT = "tcp://*:5557"
DEFAULT_BLOCK_SIZE = 16
# What to give vLLM when its KV events are off.
RECOMMENDED_KV_EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": DEFAULT_ENDPOINT, "replay_endpoint": "tcp://*:5558"}


class VllmArgs:
    """The parts of a `vllm serve` command line the agent cares about."""

    def __init__(self):
        self.model = None
        self.served_name = None
        self.port = DEFAULT_PORT
        self.block_size = DEFAULT_BLOCK_SIZE
        self.kv_events = {}
        self.dp_size = 1
        self.dp_local = None
        self.prefix_caching = True


def _value(tokens, i):
    """(value, next index) of the flag at tokens[i], `--f=v` or `--f v`."""
    flag = tokens[i]
    if "=" in flag:
        return flag.split("=", 1)[1], i + 1
    if i + 1 >= len(tokens):
        raise ValueError(f"{flag} needs a value")
    return tokens[i + 1], i + 2


def _scalar(text):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    return text


def parse_vllm(tokens):
    """Parses `vllm serve MODEL [flags]` (the leading `vllm serve` optional)."""
    tokens = list(tokens)
    if tokens[:1] == ["vllm"]:
        tokens = tokens[1:]
    if tokens[:1] == ["serve"]:
        tokens = tokens[1:]
    a = VllmArgs()
    i = 0
    if tokens and not tokens[0].startswith("-"):
        a.model, i = tokens[0], 1
    while i < len(tokens):
        t = tokens[i]
        name = t.split("=", 1)[0]
        if name == "--model":
            a.model, i = _value(tokens, i)
        elif name == "--served-model-name":
            # nargs="+": the first name is the one clients (and the agent) use.
            a.served_name, i = _value(tokens, i)
            while i < len(tokens) and not tokens[i].startswith("-") and "=" not in t:
                i += 1
        elif name == "--port":
            v, i = _value(tokens, i)
            a.port = int(v)
        elif name == "--block-size":
            v, i = _value(tokens, i)
            a.block_size = int(v)
        elif name == "--kv-events-config":
            v, i = _value(tokens, i)
            try:
                cfg = json.loads(v)
            except ValueError as e:
                raise ValueError(f"--kv-events-config is not JSON: {e}") from None
            if not isinstance(cfg, dict):
                raise ValueError("--kv-events-config must be a JSON object")
            a.kv_events.update(cfg)
        elif name.startswith("--kv-events-config."):
            key = name[len("--kv-events-config."):].replace("-", "_")
            v, i = _value(tokens, i)
            a.kv_events[key] = _scalar(v)
        elif name in ("--data-parallel-size", "-dp"):
            v, i = _value(tokens, i)
            a.dp_size = int(v)
        elif name in ("--data-parallel-size-local", "-dpl"):
            v, i = _value(tokens, i)
            a.dp_local = int(v)
        elif name == "--no-enable-prefix-caching":
            a.prefix_caching, i = False, i + 1
        elif name == "--enable-prefix-caching":
            a.prefix_caching, i = True, i + 1
        else:
            i += 1
    if not a.model:
        raise ValueError("no model: expected `vllm serve MODEL ...` or --model")
    return a


def local_endpoint(endpoint):
    """The address the agent beside the engine connects to, and a note when
    vLLM would not bind `endpoint` (it connects unless the host is a
    wildcard, or the transport is ipc/inproc)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return endpoint, f"KV-event endpoint {endpoint!r} has no scheme (tcp://*:PORT expected)"
    if scheme != "tcp":
        return endpoint, None
    host, colon, port = rest.rpartition(":")
    if not colon:
        return endpoint, f"KV-event endpoint {endpoint!r} has no port"
    if host in WILDCARD_HOSTS:
        return f"tcp://127.0.0.1:{port}", None
    return endpoint, (
        f"vLLM connects instead of binding for {endpoint!r}: the agent cannot subscribe; "
        f"give vLLM tcp://*:{port} (the agent then uses tcp://127.0.0.1:{port})"
    )


def agent_flags(v, worker_id=None, k8s=False, routers=()):
    """(agent argv without the program name, notes)."""
    notes = []
    model = v.served_name or v.model
    if k8s:
        args = ["--worker-id-from-env", "POD_IP", "--worker-id-template", f"http://{{}}:{v.port}"]
    else:
        args = ["--worker-id", worker_id or f"http://{socket.getfqdn()}:{v.port}"]
        if not worker_id:
            notes.append("--worker-id must equal the router's backend worker_id (default: its URL); pass --worker-id")
    args += ["--model", model, "--engine-url", f"http://127.0.0.1:{v.port}"]
    cfg = v.kv_events
    if not v.prefix_caching:
        notes.append("vLLM runs with --no-enable-prefix-caching: there is no prefix cache to route to")
    off = None
    if not cfg.get("enable_kv_cache_events", False):
        off = "KV events are off"
    elif cfg.get("publisher", "zmq") != "zmq":
        off = f"publisher {cfg.get('publisher')!r}: the agent reads only \"zmq\""
    if off:
        cfg = RECOMMENDED_KV_EVENTS
        notes.append(f"{off}: the agent follows KV events only; start vLLM with "
                     f"--kv-events-config '{json.dumps(cfg)}' (the flags below assume it)")
    ep, note = local_endpoint(cfg.get("endpoint") or DEFAULT_ENDPOINT)
    args += ["--kv-events", ep]
    if note:
        notes.append(note)
    if cfg.get("replay_endpoint"):
        rp, note = local_endpoint(cfg["replay_endpoint"])
        args += ["--kv-replay", rp]
        if note:
            notes.append(note)
    else:
        notes.append("no replay_endpoint: an agent (re)start misses what the engine cached before it")
    if cfg.get("topic"):
        args += ["--topic", str(cfg["topic"])]
    ranks = v.dp_local or v.dp_size
    if ranks > 1:
        args += ["--dp-ranks", str(ranks)]
        notes.append(f"{ranks} data-parallel ranks publish on port+rank: keep those ports free")
    for r in routers:
        args += ["--router", r]
    notes.append(f"the router's pool for {model!r} needs block_size: {v.block_size} (--block-size {v.block_size})")
    return args, notes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" in argv:
        split = argv.index("--")
        ours, theirs = argv[:split], argv[split + 1:]
    else:
        ours, theirs = [], argv
    p = argparse.ArgumentParser(
        prog="python -m warmpath_router.vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument("--worker-id", help="the router's worker_id of this engine (default: http://FQDN:PORT)")
    who.add_argument("--k8s", action="store_true", help="worker id from the pod IP (Downward API POD_IP)")
    p.add_argument("--router", action="append", default=[], help="router gRPC URL (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a command line")
    args = p.parse_args(ours)
    if not theirs:
        p.error("give the vllm serve command line after --")
    try:
        v = parse_vllm(theirs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    flags, notes = agent_flags(v, args.worker_id, args.k8s, args.router)
    if args.json:
        print(json.dumps({"args": flags, "block_size": v.block_size, "notes": notes}))
        return 0
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    pairs = []
    i = 0
    while i < len(flags):
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            pairs.append(f"{flags[i]} {shlex.quote(flags[i + 1])}")
            i += 2
        else:
            pairs.append(flags[i])
            i += 1
    print(" \\\n  ".join(["warmpath-agent"] + pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
