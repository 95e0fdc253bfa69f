#!/usr/bin/env python3
"""The capacity workloads (issue 21): `warmpath-bench scale` over fleets whose
total cache holds 0.5x, 0.9x and 1.5x the working set, at Zipf 0.6, 1.0 and
1.2, for several fleet sizes; prints one markdown table of the optimum bound
(and the reference on LRU engines, the oracle router; `optimum::LEGEND` says
what each assumes) against kv_aware, prefix_aware and random: hit rate, TTFT p50/p90
and the least / most busy instance's share.

Usage: capacity.py BIN [--instances 7,16] [--ratios 0.5,0.9,1.5]
       [--zipfs 0.6,1.0,1.2] [--requests 20000] [--seed 42] [-- EXTRA...]
Documents: 16 per instance (the `long` shape: 112 on 7), 500 blocks each;
EXTRA is passed to every scale run (e.g. --hide-capacity).
"""
import argparse, json, os, subprocess, sys, tempfile

STRATEGIES = ["kv_aware", "prefix_aware", "random"]


def run(binary, n, ratio, zipf, requests, seed, extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [binary, "scale", "--instances", str(n), "--docs", str(16 * n),
               "--zipf", str(zipf), "--rate-per-instance", "1.43",
               "--cache-ratio", str(ratio), "--requests", str(requests),
               "--seed", str(seed), "--strategy", ",".join(STRATEGIES),
               "--json", out] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return {r["strategy"]: r for r in json.load(f)}


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--instances", default="7,16")
    ap.add_argument("--ratios", default="0.5,0.9,1.5")
    ap.add_argument("--zipfs", default="0.6,1.0,1.2")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    print("| instances | cache x WS | zipf | bound | LRU oracle | "
          + " | ".join(f"{s} hit / p50 / p90 ms / share min-max %" for s in STRATEGIES)
          + " | kv replicate |")
    print("|" + "---|" * (5 + len(STRATEGIES) + 1))
    for n in [int(x) for x in a.instances.split(",")]:
        for ratio in [float(x) for x in a.ratios.split(",")]:
            for zipf in [float(x) for x in a.zipfs.split(",")]:
                r = run(a.binary, n, ratio, zipf, a.requests, a.seed, extra)
                opt = r["kv_aware"].get("optimum") or {}
                cells = []
                for s in STRATEGIES:
                    x = r[s]
                    cells.append(f"{100 * x['hit_rate']:.1f}% / {x['ttft_ms']['p50']:.0f} / "
                                 f"{x['ttft_ms']['p90']:.0f} / "
                                 f"{x['share_min_pct']:.1f}-{x['share_max_pct']:.1f}")
                kv = r["kv_aware"]
                pct = lambda k: "-" if opt.get(k) is None else f"{100 * opt[k]:.1f}%"
                print(f"| {n} | {ratio} | {zipf} | {pct('bound')} | {pct('lru_oracle')} | "
                      + " | ".join(cells)
                      + f" | {kv['decisions'].get('replicate', 0)} |",
                      flush=True)


if __name__ == "__main__":
    main()
