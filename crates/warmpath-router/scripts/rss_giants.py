#!/usr/bin/env python3
"""Router RSS around giant requests (BENCHMARKS.md, "router RSS").

    python3 crates/warmpath-router/scripts/rss_giants.py ROUTER_BIN MODEL_DIR ['EXTRA YAML']

MODEL_DIR: a tokenizer folder, e.g. `warmpath-engine --write-model-dir DIR` (the tiny
model). Starts a draining HTTP backend and the router (kv_aware, no prompt cap) on
127.0.0.1, sends 4 concurrent 26 MB chats, and prints the router's RSS before,
at its peak, right after and 15 s later.
"""
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROUTER_PORT, BACKEND_PORT = 18930, 18931


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, body):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        left = int(self.headers.get("content-length", 0))
        while left > 0:
            left -= len(self.rfile.read(min(left, 1 << 20)))
        self._answer(b'{"object": "chat.completion", "choices": []}')

    def do_GET(self):
        self._answer(b'{"object":"list","data":[{"id":"m","object":"model"}]}')

    def log_message(self, *args):
        pass


def main():
    binary, model = sys.argv[1], sys.argv[2]
    work = sys.argv[3] if len(sys.argv) > 3 else ""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", BACKEND_PORT), Backend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = os.path.join(tempfile.mkdtemp(), "router.yaml")
    with open(cfg, "w") as f:
        f.write(f"listen: 127.0.0.1:{ROUTER_PORT}\n{work}\nmax_body_bytes: 67108864\n"
                f"pools:\n  - model: m\n    strategy: kv_aware\n    tokenizer: {model}\n"
                f"    backends: [{{url: 'http://127.0.0.1:{BACKEND_PORT}'}}]\n")
    router = subprocess.Popen([binary, "--config", cfg],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)

    def rss():
        with open(f"/proc/{router.pid}/status") as f:
            return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS"))

    corpus = open(os.path.join(os.path.dirname(__file__),
                               "../../warmpath-tokenize/src/tiny_corpus.txt")).read()

    def body(i):
        parts, n, at = [], 0, i * 7919
        while n < 26 << 20:
            s = f"part{i}x{at} " + corpus[at % len(corpus):][:4000]
            parts.append(s)
            n += len(s)
            at += 3989
        return json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "".join(parts)}]}).encode()

    def post(b):
        req = urllib.request.Request(
            f"http://127.0.0.1:{ROUTER_PORT}/v1/chat/completions", data=b,
            headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=300).read()
        except Exception as e:  # noqa: BLE001 - report and go on
            print("request failed:", e)

    small = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    post(small)
    print("baseline MB", rss())
    threads = [threading.Thread(target=post, args=(body(i),)) for i in range(4)]
    start = time.time()
    for t in threads:
        t.start()
    peak = 0
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss())
        time.sleep(0.05)
    print("4 x 26 MB done in %.1f s, peak MB %d, right after MB %d"
          % (time.time() - start, peak, rss()))
    time.sleep(15)
    post(small)
    print("15 s later MB", rss())
    router.kill()
    server.shutdown()


if __name__ == "__main__":
    main()
