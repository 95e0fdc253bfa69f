"""A stdlib-only client for a warmpath router.

    python -m warmpath_router.client --router http://127.0.0.1:8080 chat --model m "Hello"
    python -m warmpath_router.client --router http://127.0.0.1:8080 chat --model m --stream "Hello"
    python -m warmpath_router.client --router http://127.0.0.1:8080 index
    python -m warmpath_router.client --router http://127.0.0.1:8080 query --model m "Hello"
    python -m warmpath_router.client --router http://127.0.0.1:8080 --token T strategy m kv_aware

`chat` prints the answer and the routing headers (x-warmpath-backend,
x-warmpath-decision) on stderr; `--stream` prints the text as it arrives
(server-sent events); `--tenant` sends X-Prefix-Aware-Id. `index` prints
GET /cache-index, `query` POST /cache-index/query (nothing is sent upstream),
`strategy` switches a pool's strategy through the admin API.

Two bearer tokens: `--token` (or WARMPATH_INSPECT_TOKEN / WARMPATH_ADMIN_TOKEN)
for /cache-index, /cache-index/query and the admin API; `--api-key` (or
OPENAI_API_KEY) for the OpenAI endpoints (a pool with `tenants: {from: api_key}`
derives the tenant from it).

As a library: `Client(base, token=..., api_key=...).chat(model, messages)`,
`.chat_stream(...)` (yields each event's JSON), `.index()`, `.query(...)`,
`.set_strategy(...)`.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

ROUTING_HEADERS = ("x-warmpath-backend", "x-warmpath-decision")


class WarmpathError(Exception):
    """An answer with an error status, or an error event inside a stream."""

    def __init__(self, status, body):
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body}")


class Response:
    """Status, headers (lower-case names) and the decoded JSON body."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.raw = body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def routing(self):
        return {k: self.headers.get(k) for k in ROUTING_HEADERS}


class Client:
    def __init__(self, base_url="http://127.0.0.1:8080", token=None, api_key=None, timeout=120.0):
        self.base = base_url.rstrip("/")
        self.token = token
        self.api_key = api_key
        self.timeout = timeout

    def _request(self, method, path, body=None, headers=None, bearer=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        if bearer:
            req.add_header("authorization", "Bearer " + bearer)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        return urllib.request.urlopen(req, timeout=self.timeout)

    def _call(self, method, path, body=None, headers=None, bearer=None):
        try:
            with self._request(method, path, body, headers, bearer) as resp:
                return Response(resp.status, dict(resp.headers), resp.read())
        except urllib.error.HTTPError as e:
            return Response(e.code, dict(e.headers), e.read())

    @staticmethod
    def _chat_body(model, messages, max_tokens, extra):
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        body.update(extra)
        return body

    @staticmethod
    def _tenant(tenant):
        return {"X-Prefix-Aware-Id": tenant} if tenant else {}

    def chat(self, model, messages, max_tokens=16, tenant=None, **extra):
        """POST /v1/chat/completions; a `Response` (errors included)."""
        body = self._chat_body(model, messages, max_tokens, extra)
        return self._call("POST", "/v1/chat/completions", body, self._tenant(tenant), self.api_key)

    def chat_stream(self, model, messages, max_tokens=16, tenant=None, on_headers=None, **extra):
        """POST /v1/chat/completions with `stream: true`; yields each event's
        JSON until `[DONE]`. Raises `WarmpathError` on an error status or an
        error event. `on_headers(dict)` sees the answer's headers first."""
        body = self._chat_body(model, messages, max_tokens, extra)
        body["stream"] = True
        try:
            resp = self._request("POST", "/v1/chat/completions", body, self._tenant(tenant), self.api_key)
        except urllib.error.HTTPError as e:
            raise WarmpathError(e.code, e.read().decode(errors="replace")) from None
        with resp:
            if on_headers:
                on_headers({k.lower(): v for k, v in resp.headers.items()})
            for data in sse_data(resp):
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event:
                    raise WarmpathError(resp.status, data)
                yield event

    def index(self):
        return self._call("GET", "/cache-index", bearer=self.token)

    def query(self, body, tenant=None):
        return self._call("POST", "/cache-index/query", body, self._tenant(tenant), self.token)

    def set_strategy(self, model, strategy):
        return self._call("PUT", f"/admin/pools/{model}/strategy", {"strategy": strategy}, bearer=self.token)


def sse_data(lines):
    """The `data:` payloads of a server-sent-event stream (an iterable of
    byte lines), one string per event (multi-line data joined by newlines)."""
    buf = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            buf.append(value[1:] if value.startswith(" ") else value)
    if buf:
        yield "\n".join(buf)


def _print_body(resp):
    if resp.json is not None:
        print(json.dumps(resp.json, indent=2))
    else:
        sys.stdout.write(resp.raw.decode(errors="replace"))


def _print_routing(headers):
    for k in ROUTING_HEADERS:
        print(f"{k}: {headers.get(k)}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m warmpath_router.client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--token", default=os.environ.get("WARMPATH_INSPECT_TOKEN") or os.environ.get("WARMPATH_ADMIN_TOKEN"))
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--timeout", type=float, default=120.0)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("chat", "query"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
        s.add_argument("--tenant")
        s.add_argument("--max-tokens", type=int, default=16)
        if name == "chat":
            s.add_argument("--stream", action="store_true", help="print the text as it arrives (SSE)")
        s.add_argument("text")
    sub.add_parser("index")
    s = sub.add_parser("strategy")
    s.add_argument("model")
    s.add_argument("strategy", choices=["random", "least_outstanding", "prefix_aware", "kv_aware"])
    args = p.parse_args(argv)
    c = Client(args.router, token=args.token, api_key=args.api_key, timeout=args.timeout)

    if args.cmd == "index":
        resp = c.index()
    elif args.cmd == "strategy":
        resp = c.set_strategy(args.model, args.strategy)
    else:
        messages = [{"role": "user", "content": args.text}]
        if args.cmd == "query":
            body = {"model": args.model, "messages": messages, "max_tokens": args.max_tokens}
            resp = c.query(body, args.tenant)
        elif args.stream:
            try:
                for event in c.chat_stream(args.model, messages, args.max_tokens, args.tenant, on_headers=_print_routing):
                    for choice in event.get("choices") or []:
                        sys.stdout.write((choice.get("delta") or {}).get("content") or "")
                        sys.stdout.flush()
            except WarmpathError as e:
                print(f"\nerror: {e}", file=sys.stderr)
                return 1
            print()
            return 0
        else:
            resp = c.chat(args.model, messages, args.max_tokens, args.tenant)
            _print_routing(resp.headers)
    _print_body(resp)
    return 0 if resp.status < 400 else 1


if __name__ == "__main__":
    sys.exit(main())
