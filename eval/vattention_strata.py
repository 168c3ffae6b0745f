#!/usr/bin/env python3
"""Would stratifying vattention-lsh's residual sample pay? A NumPy study on real keys and queries.

vattention-lsh (common/attention/vattention.h) attends MagicPIG's candidates (keys colliding with
the query in >= 2 of L SimHash tables) exactly and estimates the rest of the denominator D from one
uniform sample sized by the CLT bound. This script measures, per (sparse layer, query head, query)
of query/key dumps (magicpig_dump_qk, eval/spotlight/collect.py), the share of the true top 1% of
keys that the candidates hold, and for several designs of the residual sample the keys touched and
the share of queries whose estimate of D is within epsilon of the truth (the bound asks for
>= 1 - delta):

- oracle sizes (the sample size the CLT bound asks for with the residual's true spread): uniform,
  and stratified with Neyman allocation b_s ~ n_s sigma_s over strata by collision count (0 or 1
  table) and by key-norm quantile (4 or 8 buckets);
- realised: each stratum's spread from its own base sample of max(2, rate * n_s) keys, as the
  estimator does, then the sample drawn and D estimated.

The keys are centred per kv head (qkdata.Dump.centred_region_keys, as the engine centres them
before hashing; centring shifts every logit of a query by the same amount, so the weights' ratios
are those of the raw keys). SimHash planes are Gaussian, K x L per kv head, seeded; the dumps' last
queries are scored against the whole offloaded region (qkdata.Dump.region).

With --spot FILE (trained hashes, eval/spotlight/train.py) two more finders are judged with a
uniform residual: the --spot-fraction of keys nearest the query by learned code (what
vattention-spotlight keeps exact), and their union with the SimHash candidates. With --sketch R
the same fraction of keys best by the low-rank key sketch of R int8 coordinates
(eval/spotlight/dominant.py's sketch: what vattention-sketch keeps exact), uniform residual.

Usage: vattention_strata.py --dumps 'DIR/doc000[01].qk' [--epsilon 0.3] [--delta 0.1]
                            [--base-rate 0.02] [--k 10] [--l 150] [--query-stride 4]
                            [--spot FILE.spot --spot-fraction 0.01] [--sketch 32]
"""

import argparse
import glob
import os
import sys
from collections import defaultdict
from statistics import NormalDist

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "spotlight"))
from qkdata import (Dump, engine_dense_layers, hamming, lsh_codes, nearest,  # noqa: E402
                    pack_bits)
import spotfile  # noqa: E402
from dominant import sketch  # noqa: E402

NORM_QUANTILES = {4: [0.5, 0.8, 0.95], 8: [0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98]}


def learned_nearest(sp, slot, head, q, key_codes, fraction):
    """Boolean [R]: the ceil(fraction * R) keys nearest q by learned code (ties: lower index)."""
    qb = pack_bits(spotfile.outputs64(sp.queries[slot][head], q[None, :]))
    return nearest(hamming(qb, key_codes), max(1, int(np.ceil(fraction * len(key_codes)))))[0]


def oracle_size(w, strata, z, eps, d):
    """Keys the CLT bound asks for with the true spreads (Neyman allocation over strata)."""
    spread = sum(len(s) * w[s].std() for s in strata if len(s) > 1)
    n = sum(len(s) for s in strata)
    return min(n, (z * spread / (eps * d)) ** 2)


def realised(w, cand, strata, z, eps, rate, rng):
    """(within epsilon, keys touched) of one estimate with base samples per stratum."""
    base, sig, mean = [], [], []
    for s in strata:
        nb = min(len(s), max(2, int(rate * len(s))))
        pick = rng.choice(s, nb, replace=False)
        base.append(pick)
        sig.append(w[pick].std(ddof=1) if nb >= 2 else 0.0)
        mean.append(w[pick].mean() if nb >= 1 else 0.0)
    d0 = w[cand].sum() + sum(len(s) * m for s, m in zip(strata, mean))
    spread = sum(len(s) * sg for s, sg in zip(strata, sig))
    total = (z * spread / (eps * d0)) ** 2 if d0 > 0 else 0.0
    d_hat, touched = w[cand].sum(), int(cand.sum())
    for s, sg, pick0 in zip(strata, sig, base):
        if len(s) == 0:
            continue
        b = int(np.ceil(total * len(s) * sg / spread)) if spread > 0 else 0
        b = min(len(s), max(len(pick0), b))
        pick = rng.choice(s, b, replace=False)
        d_hat += len(s) / b * w[pick].sum()
        touched += len(np.union1d(pick, pick0))
    return d_hat, touched


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dumps", required=True, help="glob of magicpig_dump_qk files")
    ap.add_argument("--epsilon", type=float, default=0.3)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--base-rate", type=float, default=0.02)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--l", type=int, default=150)
    ap.add_argument("--query-stride", type=int, default=4, help="use every n-th dumped query")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spot", default="", help="trained hashes: also judge learned finders")
    ap.add_argument("--spot-fraction", type=float, default=0.01,
                    help="the fraction kept exact by the learned and the sketch finders")
    ap.add_argument("--sketch", type=int, default=0,
                    help="R: also judge the key sketch of R int8 coordinates as the finder")
    args = ap.parse_args()
    spot = spotfile.read(args.spot) if args.spot else None
    paths = sorted(glob.glob(args.dumps))
    if not paths:
        raise SystemExit(f"no dump matches {args.dumps}")
    z = NormalDist().inv_cdf(1 - args.delta / 2)
    rng = np.random.default_rng(args.seed)
    tot = defaultdict(float)
    for path in paths:
        dump = Dump(path)
        dense = engine_dense_layers(dump.n_layer_model)
        g = dump.n_head // dump.n_head_kv
        for layer in dump.layers:
            if layer in dense:
                continue
            keys = dump.centred_region_keys(layer).astype(np.float64)  # [kv][R][d]
            queries = np.array(dump.queries(layer), dtype=np.float64)[::args.query_stride]
            for kv in range(dump.n_head_kv):
                k = keys[kv]
                planes = rng.standard_normal((args.k * args.l, dump.head_dim))
                kcode = lsh_codes(k, planes, args.k)
                norm = np.linalg.norm(k, axis=1)
                bucket = {nb: np.digitize(norm, np.quantile(norm, q))
                          for nb, q in NORM_QUANTILES.items()}
                if args.sketch:
                    u, key_sketch = sketch(k, args.sketch)
                if spot is not None:
                    slot = spot.layers.index(layer)
                    key_codes = pack_bits(spotfile.outputs64(spot.keys[slot][kv], k))
                group_q = queries[:, kv * g:(kv + 1) * g].reshape(-1, dump.head_dim)
                for i, (q, qcode) in enumerate(zip(group_q, lsh_codes(group_q, planes, args.k))):
                    count = (kcode == qcode).sum(1)
                    x = k @ q / np.sqrt(dump.head_dim)
                    w = np.exp(x - x.max())
                    d = w.sum()
                    cand = count >= 2
                    top = np.argsort(-w)[:max(1, len(w) // 100)]
                    rest = np.flatnonzero(~cand)
                    one, zero = np.flatnonzero(count == 1), np.flatnonzero(count == 0)
                    designs = {"uniform": [rest], "collisions": [one, zero]}
                    for nb in NORM_QUANTILES:
                        designs[f"norm{nb}"] = [rest[bucket[nb][rest] == i] for i in range(nb)]
                        designs[f"collisions x norm{nb}"] = [
                            s[bucket[nb][s] == i] for s in (one, zero) for i in range(nb)]
                    designs["candidates + true top 1%"] = [np.setdiff1d(rest, top)]
                    designs["true top 1% alone (vattention)"] = [
                        np.setdiff1d(np.arange(len(w)), top)]
                    finders = {}  # deterministic sets other than the SimHash candidates
                    if spot is not None:
                        near = learned_nearest(spot, slot, kv * g + i % g, q, key_codes,
                                               args.spot_fraction)
                        tot["learned recall"] += near[top].mean()
                        tot["learned union recall"] += (near | cand)[top].mean()
                        for name, f in ((f"learned nearest {args.spot_fraction:.1%}", near),
                                        ("learned nearest ∪ candidates", near | cand)):
                            designs[name] = [np.flatnonzero(~f)]
                            finders[name] = f
                    if args.sketch:
                        m = max(1, int(np.ceil(args.spot_fraction * len(k))))
                        best = nearest(-((q @ u) @ key_sketch.T)[None, :], m)[0]
                        tot["sketch recall"] += best[top].mean()
                        name = f"best {args.spot_fraction:.1%} by sketch-{args.sketch}"
                        designs[name] = [np.flatnonzero(~best)]
                        finders[name] = best
                    tot["queries"] += 1
                    tot["candidates"] += cand.mean()
                    tot["top-1% recall"] += cand[top].mean()
                    tot["one collision"] += (count >= 1).mean()
                    tot["one collision recall"] += (count >= 1)[top].mean()
                    # What a better heavy-hitter finder would buy: the candidates plus the true
                    # top 1%, and the true top 1% alone (vattention's deterministic set).
                    ideal = cand.copy()
                    ideal[top] = True
                    only_top = np.zeros_like(cand)
                    only_top[top] = True
                    finders.update({"candidates + true top 1%": ideal,
                                    "true top 1% alone (vattention)": only_top})
                    for name, strata in designs.items():
                        finder = finders.get(name, cand)
                        tot[name, "oracle"] += (finder.sum() + oracle_size(
                            w, strata, z, args.epsilon, d)) / len(w)
                        d_hat, touched = realised(w, finder, strata, z, args.epsilon,
                                                  args.base_rate, rng)
                        tot[name, "within"] += abs(d_hat / d - 1) <= args.epsilon
                        tot[name, "touched"] += touched / len(w)
    n = tot["queries"]
    print(f"{len(paths)} dumps, {int(n)} (layer, head, query) triples, eps {args.epsilon}, "
          f"delta {args.delta}, base rate {args.base_rate}, tables ({args.k}, {args.l})")
    print(f"candidates {tot['candidates'] / n:.2%} of the keys; they hold "
          f"{tot['top-1% recall'] / n:.1%} of the true top 1%; the keys colliding in >= 1 table "
          f"({tot['one collision'] / n:.1%}) hold {tot['one collision recall'] / n:.1%} of it")
    if spot is not None:
        print(f"learned codes ({spot.bits} bits), nearest {args.spot_fraction:.1%}: they hold "
              f"{tot['learned recall'] / n:.1%} of the true top 1%; with the candidates "
              f"{tot['learned union recall'] / n:.1%}")
    if args.sketch:
        print(f"key sketch ({args.sketch} int8 coordinates), best {args.spot_fraction:.1%}: they "
              f"hold {tot['sketch recall'] / n:.1%} of the true top 1%")
    print("| deterministic set, residual sample | keys touched, oracle size | keys touched, realised | D within eps |")
    print("|---|---:|---:|---:|")
    for name in designs:
        print(f"| {name} | {tot[name, 'oracle'] / n:.1%} | {tot[name, 'touched'] / n:.1%} | "
              f"{tot[name, 'within'] / n:.3f} |")


if __name__ == "__main__":
    main()
