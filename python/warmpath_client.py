#!/usr/bin/env python3
"""A small stdlib-only client for a warmpath router.

    python3 python/warmpath_client.py --router http://127.0.0.1:8080 chat --model m "Hello"
    python3 python/warmpath_client.py --router http://127.0.0.1:8080 index
    python3 python/warmpath_client.py --router http://127.0.0.1:8080 query --model m "Hello"
    python3 python/warmpath_client.py --router http://127.0.0.1:8080 --token T strategy m kv_aware

`chat` prints the answer and the routing headers (x-warmpath-backend,
x-warmpath-decision); `--tenant` sends X-Prefix-Aware-Id. `index` prints
GET /cache-index, `query` POST /cache-index/query (nothing is sent upstream),
`strategy` switches a pool's strategy through the admin API. `--token` (or
WARMPATH_INSPECT_TOKEN / WARMPATH_ADMIN_TOKEN) is sent as a bearer token: the
router asks for it on /cache-index, /cache-index/query and the admin API when
it has one.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request


def call(method, url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def chat_body(args):
    return {
        "model": args.model,
        "messages": [{"role": "user", "content": args.text}],
        "max_tokens": args.max_tokens,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=os.environ.get("WARMPATH_INSPECT_TOKEN")
                   or os.environ.get("WARMPATH_ADMIN_TOKEN"))
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("chat", "query"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
        s.add_argument("--tenant")
        s.add_argument("--max-tokens", type=int, default=16)
        s.add_argument("text")
    sub.add_parser("index")
    s = sub.add_parser("strategy")
    s.add_argument("model")
    s.add_argument("strategy", choices=["random", "least_outstanding", "prefix_aware", "kv_aware"])
    args = p.parse_args()
    base = args.router.rstrip("/")
    auth = {"authorization": "Bearer " + args.token} if args.token else {}

    if args.cmd == "index":
        status, _, body = call("GET", base + "/cache-index", headers=auth)
    elif args.cmd == "strategy":
        status, _, body = call("PUT", f"{base}/admin/pools/{args.model}/strategy",
                               {"strategy": args.strategy}, auth)
    else:
        headers = {"X-Prefix-Aware-Id": args.tenant} if args.tenant else {}
        if args.cmd == "query":
            headers.update(auth)
        path = "/v1/chat/completions" if args.cmd == "chat" else "/cache-index/query"
        status, hdrs, body = call("POST", base + path, chat_body(args), headers)
        if args.cmd == "chat":
            for k in ("x-warmpath-backend", "x-warmpath-decision"):
                v = next((v for h, v in hdrs.items() if h.lower() == k), None)
                print(f"{k}: {v}", file=sys.stderr)
    try:
        print(json.dumps(json.loads(body), indent=2))
    except ValueError:
        sys.stdout.write(body.decode(errors="replace"))
    return 0 if status < 400 else 1


if __name__ == "__main__":
    sys.exit(main())
