#!/usr/bin/env python3
"""The wheel, end to end: build it the way `pip install ./python` does (maturin's
PEP 517 backend), install it into a fresh venv, start the *installed* router and
agent against the simulated vLLM (`warmpath-bench sim`) on 127.0.0.1, with the
agent's flags printed by the installed `warmpath_router.vllm` helper from a
`vllm serve` line, and route requests through the installed client (plain and
streaming) until the agent's KV events show in the router's index. Also builds
the wheel for PyPI (`maturin build`) and checks its audited manylinux tag.

    python3 python/tests/test_wheel.py

Environment: WARMPATH_BUILD_VENV, a venv with maturin (made here from PyPI when
unset); WARMPATH_WHEEL_PROFILE, a cargo profile instead of the pyproject's
`wheel` (`dev` reuses what `cargo test` built); WARMPATH_BENCH_BIN, the
simulator binary (default target/debug/warmpath-bench). Prints the time of each
phase. Exit 0: passed.
"""

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = "warmpath-tiny"
# python/pyproject.toml's `[tool.maturin] compatibility`.
MANYLINUX = "manylinux_2_34"
TIMES = []


def phase(name, t0):
    dt = time.monotonic() - t0
    TIMES.append((name, dt))
    print(f"== {name}: {dt:.1f} s", flush=True)


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def venv(path):
    run([sys.executable, "-m", "venv", path])
    return os.path.join(path, "bin")


class Proc:
    """A child whose stdout lines are kept (and echoed) by a reader thread."""

    def __init__(self, name, cmd, env=None):
        print(f"+ [{name}] " + " ".join(cmd), flush=True)
        self.name = name
        self.lines = []
        self.cond = threading.Condition()
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            sys.stdout.write(f"[{self.name}] {line}")
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pred, timeout=60.0):
        """The first output line for which pred(line) is not None."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    v = pred(line)
                    if v is not None:
                        return v
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.p.poll() is not None and seen == len(self.lines):
                    raise AssertionError(f"{self.name} exited ({self.p.returncode}) before the expected line")
                if left <= 0:
                    raise AssertionError(f"{self.name}: no expected line within {timeout} s")
                self.cond.wait(min(left, 0.5))

    def stop(self, sig):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def after(prefix):
    return lambda line: line[len(prefix):].split()[0] if line.startswith(prefix) else None


def get(url, timeout=5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def poll(what, check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def build_wheel(work):
    t0 = time.monotonic()
    build_bin = os.environ.get("WARMPATH_BUILD_VENV")
    if build_bin:
        # Absolute: pip runs the build hook from another directory, and a
        # relative PATH entry would not find maturin there.
        build_bin = os.path.join(os.path.abspath(build_bin), "bin")
    else:
        build_bin = venv(os.path.join(work, "build"))
        run([os.path.join(build_bin, "pip"), "install", "-q", "maturin>=1.5,<2"])
    env = dict(os.environ, PATH=build_bin + os.pathsep + os.environ["PATH"])
    profile = os.environ.get("WARMPATH_WHEEL_PROFILE")
    if profile:
        env["MATURIN_PEP517_ARGS"] = f"--profile {profile}"
    dist = os.path.join(work, "dist")
    # What `pip install ./python` runs, minus the isolated build env (maturin
    # comes from the build venv above, so this works with PyPI mirrored).
    run([os.path.join(build_bin, "pip"), "wheel", "-q", "--no-build-isolation", "--no-deps",
         os.path.join(ROOT, "python"), "-w", dist], env=env)
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    phase(f"build wheel {wheels[0]} (profile {profile or 'wheel'})", t0)
    build_pypi_wheel(work, build_bin, env, profile, os.path.join(dist, wheels[0]))
    return os.path.join(dist, wheels[0])


def build_pypi_wheel(work, build_bin, env, profile, local_wheel):
    """The wheel for PyPI: `maturin build` honours `[tool.maturin] compatibility`
    (pip's PEP 517 hook passes `--compatibility off`, hence `linux_x86_64` above,
    which PyPI refuses) and audits it: it refuses the tag if a binary needs a
    newer glibc symbol version or a library outside the manylinux policy."""
    t0 = time.monotonic()
    dist = os.path.join(work, "dist-pypi")
    cmd = [os.path.join(build_bin, "maturin"), "build", "--out", dist]
    if profile:
        cmd += ["--profile", profile]
    run(cmd, cwd=os.path.join(ROOT, "python"), env=env)
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    # glibc 2.34 (Debian bookworm has 2.36): std's __libc_start_main, dlsym and
    # pthread_* are versioned GLIBC_2.34 when linked against glibc >= 2.34.
    want = f"-py3-none-{MANYLINUX}_{platform.machine()}.whl"
    assert wheels[0].endswith(want), (wheels[0], want)
    with zipfile.ZipFile(local_wheel) as a, zipfile.ZipFile(os.path.join(dist, wheels[0])) as b:
        assert sorted(a.namelist()) == sorted(b.namelist()), "the PyPI wheel ships other files"
    phase(f"build PyPI wheel {wheels[0]}", t0)


def main():
    work = tempfile.mkdtemp(prefix="warmpath-wheel-")
    procs = []
    try:
        wheel = build_wheel(work)
        t0 = time.monotonic()
        bin_dir = venv(os.path.join(work, "run"))
        py = os.path.join(bin_dir, "python")
        run([os.path.join(bin_dir, "pip"), "install", "-q", "--no-index", wheel])
        for b in ("warmpath-router", "warmpath-agent"):
            assert os.access(os.path.join(bin_dir, b), os.X_OK), f"{b} not installed in {bin_dir}"
        out = subprocess.run([py, "-m", "warmpath_router.router", "--version"], check=True,
                             capture_output=True, text=True).stdout
        assert out.startswith("warmpath-router "), out
        out = subprocess.run([py, "-m", "warmpath_router.agent", "--version"], check=True,
                             capture_output=True, text=True).stdout
        assert out.startswith("warmpath-agent "), out
        # The helpers' unit tests, against the installed package (cwd: not the checkout's python/).
        run([py, "-m", "unittest", "-q", "test_helpers"], cwd=os.path.dirname(os.path.abspath(__file__)))
        phase("install into a fresh venv", t0)

        # The installed binaries only: no checkout binaries on this PATH.
        env = dict(os.environ, PATH=bin_dir + os.pathsep + "/usr/bin:/bin", RUST_LOG="info")
        t0 = time.monotonic()
        bench = os.environ.get("WARMPATH_BENCH_BIN") or os.path.join(ROOT, "target", "debug", "warmpath-bench")
        if not os.path.exists(bench):
            run(["cargo", "build", "-q", "-p", "warmpath-bench"], cwd=ROOT)
        sim = Proc("sim", [bench, "sim", "--instances", "1", "--model", MODEL])
        procs.append((sim, signal.SIGINT))
        line = sim.wait_line(lambda l: l.split() if " kv-events " in l else None)
        # "  ID  http URL  kv-events E  replay R"
        engine_url = line[line.index("http") + 1]
        kv = line[line.index("kv-events") + 1]
        replay = line[line.index("replay") + 1]
        engine_port = engine_url.rsplit(":", 1)[1]

        router = Proc("router", [py, "-m", "warmpath_router.router", "--listen", "127.0.0.1:0",
                                 "--grpc-listen", "127.0.0.1:0", "--model", MODEL,
                                 "--strategy", "prefix_aware", "--backend", engine_url,
                                 "--drain-grace-ms", "100"], env=env)
        procs.append((router, signal.SIGTERM))
        http = router.wait_line(after("listening on http://"))
        grpc = router.wait_line(after("grpc listening on "))

        vllm_line = ["vllm", "serve", MODEL, "--port", engine_port, "--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": "tcp://*:" + kv.rsplit(":", 1)[1],
            "replay_endpoint": "tcp://*:" + replay.rsplit(":", 1)[1]})]
        helper = json.loads(subprocess.run(
            [py, "-m", "warmpath_router.vllm", "--json", "--worker-id", engine_url, "--router", grpc, "--"]
            + vllm_line, check=True, capture_output=True, text=True).stdout)
        args = helper["args"]
        assert args[args.index("--kv-events") + 1] == kv, (args, kv)
        assert args[args.index("--kv-replay") + 1] == replay, (args, replay)
        agent = Proc("agent", ["warmpath-agent", *args, "--listen", "127.0.0.1:0"], env=env)
        procs.append((agent, signal.SIGINT))
        agent_http = agent.wait_line(after("warmpath-agent listening on http://"))
        poll("router /readyz", lambda: get(f"http://{http}/readyz")[0] == 200)
        poll("agent /readyz", lambda: get(f"http://{agent_http}/readyz")[0] == 200)
        phase("start installed router + agent against the sim", t0)

        t0 = time.monotonic()
        text = "Summarise this document for me. " + "The quick brown fox jumps over the lazy dog. " * 40
        cli = [py, "-m", "warmpath_router.client", "--router", f"http://{http}", "chat", "--model", MODEL]
        r = subprocess.run(cli + [text], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert f"x-warmpath-backend: {engine_url}" in r.stderr, r.stderr
        assert json.loads(r.stdout)["choices"][0]["message"]["content"], r.stdout
        r = subprocess.run(cli + ["--stream", text], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        assert r.stdout.strip(), "the stream printed no text"

        def indexed():
            status, body = get(f"http://{http}/cache-index")
            if status != 200:
                return None
            w = json.loads(body)["pools"][0]["workers"][0]
            return w if w["blocks"] > 0 and w["agent"] else None

        w = poll("the agent's blocks in the router's index", indexed)
        print(f"router index: {w['blocks']} blocks from the agent of {w['worker_id']}")
        phase("route through the installed client (plain + stream), index fed by the agent", t0)
        for sig_proc in reversed(procs):
            sig_proc[0].stop(sig_proc[1])
        assert router.p.returncode == 0, f"router exit {router.p.returncode} on SIGTERM"
        print("PASS test_wheel: " + ", ".join(f"{n} {t:.1f} s" for n, t in TIMES))
        return 0
    finally:
        for proc, sig in reversed(procs):
            proc.stop(sig)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
