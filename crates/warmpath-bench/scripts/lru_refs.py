#!/usr/bin/env python3
"""What routers on LRU engines can reach (issue 21): references beside the
optimum bound, on the scale model's document workload (IID Zipf requests,
every document the same size; hit rates counted like `scale`: a hit saves
the document's 8000 of 8050 prompt tokens). Pure hit-rate models: no timing,
no in-flight limits.

- first sights: only each document's first request misses (the ceiling).
- pooled Belady: one cache of the fleet's capacity, Belady's rule with
  bypass: the upper bound `scale` reports (any router, any engine policy).
- pooled static top-K: one cache pinning the K hottest documents (true
  popularity): the best fixed set; what pinning by popularity can reach.
- pooled LRU: one LRU cache of the fleet's capacity.
- oracle on LRU engines: n LRU caches (as vLLM); a request goes to a holder,
  else to a cache with room, else to the one whose LRU victim is next used
  furthest in the future (the router knows the whole trace; the engines
  still evict LRU). Greedy: a strong reference, not a bound.
- static pin, T tail instances: the K = (n - T) * c hottest documents (doc 0
  optionally with 2 copies) dealt to n - T instances by popularity (LPT),
  every other document to a random tail instance; LRU everywhere. What a
  router that knew the popularity could do with LRU engines.

Usage: lru_refs.py INSTANCES ZIPF CACHE_RATIO [--requests 20000] [--seed 42]
(16 documents per instance, as capacity.py.) The trace is Python's, not the
Rust sim's: figures agree with `scale` to a few tenths of a point.
"""
import argparse, bisect, random
from collections import OrderedDict

NEVER = 10**12


def trace(docs, s, n, seed):
    w = [1 / (k + 1) ** s for k in range(docs)]
    t = sum(w)
    cdf, a = [], 0.0
    for x in w:
        a += x / t
        cdf.append(a)
    r = random.Random(seed)
    return [min(bisect.bisect_right(cdf, r.random()), docs - 1) for _ in range(n)], [x / t for x in w]


def next_uses(tr):
    nx, last = [0] * len(tr), {}
    for i in range(len(tr) - 1, -1, -1):
        nx[i] = last.get(tr[i], NEVER)
        last[tr[i]] = i
    return nx


def pooled_belady(tr, cap):
    nx, res, hits = next_uses(tr), {}, 0
    for i, d in enumerate(tr):
        if d in res:
            hits += 1
            res[d] = nx[i]
        elif len(res) < cap:
            res[d] = nx[i]
        else:
            far = max(res, key=res.get)
            if res[far] > nx[i]:
                del res[far]
                res[d] = nx[i]
    return hits


def pooled_lru(tr, cap):
    c, hits = OrderedDict(), 0
    for d in tr:
        if d in c:
            hits += 1
            c.move_to_end(d)
        else:
            c[d] = 1
            if len(c) > cap:
                c.popitem(last=False)
    return hits


def static_top(tr, cap):
    seen, hits = set(), 0
    for d in tr:
        hits += d < cap and d in seen
        seen.add(d)
    return hits


def lru_fleet(tr, n, cap, route):
    caches, hits, served = [OrderedDict() for _ in range(n)], 0, [0] * n
    for i, d in enumerate(tr):
        b = route(i, d, caches)
        served[b] += 1
        c = caches[b]
        if d in c:
            hits += 1
            c.move_to_end(d)
        else:
            c[d] = 1
            if len(c) > cap:
                c.popitem(last=False)
    return hits, served


def oracle_lru(tr, n, cap):
    nx, upcoming = next_uses(tr), {}

    def route(i, d, caches):
        upcoming[d] = nx[i]
        for b in range(n):
            if d in caches[b]:
                return b
        for b in range(n):
            if len(caches[b]) < cap:
                return b
        return max(range(n), key=lambda b: upcoming.get(next(iter(caches[b])), NEVER))

    return lru_fleet(tr, n, cap, route)


def static_pin(tr, p, n, cap, tail, copies):
    hot, rng = n - tail, random.Random(7)
    k = min(hot * cap - (copies - 1), len(p))
    items = sorted(((p[d] / (copies if d == 0 else 1), d) for d in range(k)
                    for _ in range(copies if d == 0 else 1)), reverse=True)
    load, count, where = [0.0] * hot, [0] * hot, {}
    for pp, d in items:
        b = min((b for b in range(hot) if count[b] < cap and b not in where.get(d, [])),
                key=lambda b: load[b])
        load[b] += pp
        count[b] += 1
        where.setdefault(d, []).append(b)
    turn = [0]

    def route(i, d, caches):
        if d in where:
            turn[0] += 1
            return where[d][turn[0] % len(where[d])]
        return hot + rng.randrange(tail) if tail else rng.randrange(n)

    return lru_fleet(tr, n, cap, route)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("instances", type=int)
    ap.add_argument("zipf", type=float)
    ap.add_argument("ratio", type=float)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    n, docs = a.instances, 16 * a.instances
    cap = max(1, round(a.ratio * docs / n))
    tr, p = trace(docs, a.zipf, a.requests, a.seed)
    f = 8000 / 8050

    def row(name, hits, served=None):
        share = "" if served is None else " | %.1f-%.1f" % (
            100 * min(served) / len(tr), 100 * max(served) / len(tr))
        print(f"| {name} | {100 * hits / len(tr) * f:.1f}%{share} |")

    print(f"{n} instances, {docs} documents, Zipf {a.zipf}, {cap} documents per cache")
    print("| reference | hit rate | share min-max % |\n|---|---|---|")
    row("first sights (ceiling)", len(tr) - len(set(tr)))
    row("pooled Belady (the bound)", pooled_belady(tr, cap * n))
    row("pooled static top-K", static_top(tr, cap * n))
    row("pooled LRU", pooled_lru(tr, cap * n))
    row("oracle router on LRU engines", *oracle_lru(tr, n, cap))
    for tail in range(0, 3):
        for copies in (1, 2):
            row(f"static pin, {tail} tail, hottest x{copies}",
                *static_pin(tr, p, n, cap, tail, copies))


if __name__ == "__main__":
    main()
