#!/usr/bin/env python3
"""Retrieval quality of trained spotlight hashes on held-out documents, per layer, against SimHash
with the same number of bits and against MagicPIG(K, L)'s retrieved set (docs/spotlight.md).

For each sparse layer, held-out document, query head and query (every --query-stride-th dumped
query), the truth is the top --top fraction of the document's offloaded keys by exact score
q . (k - c). Methods:
  - spotlight-B (each .spot file given): keys' and query's trained codes; the keys nearest in
    Hamming distance (ties: lower index) are retrieved;
  - simhash-B: the same retrieval with B random hyperplanes (seeded Gaussian, on q and k - c);
  - magicpig(K,L): keys colliding with the query in at least 2 of L tables of K random hyperplanes
    (as the engine's tables retrieve).
The Hamming methods retrieve (a) the top fraction itself and (b) MagicPIG's mean retrieved
fraction on that layer (equal touched keys). Reported: recall of the true top set and IoU
(|ret & top| / |ret | top|, the Spotlight paper's measure), mean over queries, with the standard
error over documents. Index bytes per key and kv head: B / 8 for the codes; MagicPIG's L 16-bit
entries plus its bucket offsets (L (2^K + 1) offsets, 16-bit below 65,536 keys as the engine
stores them) spread over the region's keys.

Usage: retrieval.py --data DIR --docs 96:120 --spot FILE [--spot FILE ...] [--top 0.02]
                    [--lsh-k 10] [--lsh-l 150] [--query-stride 4] [--dense 0,N/2] [--json OUT]
"""

import argparse
import json
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import qkdata  # noqa: E402
import spotfile  # noqa: E402

def scores(ret, truth):
    inter = (ret & truth).sum(1)
    return inter / truth.sum(1), inter / (ret | truth).sum(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--docs", default="96:120")
    ap.add_argument("--spot", action="append", default=[])
    ap.add_argument("--top", type=float, default=0.02)
    ap.add_argument("--lsh-k", type=int, default=10)
    ap.add_argument("--lsh-l", type=int, default=150)
    ap.add_argument("--query-stride", type=int, default=4)
    ap.add_argument("--dense", default="",
                    help="layers kept exact (skipped); default the engine's {0, n_layer / 2}")
    ap.add_argument("--layers", default="", help="comma list (default: every sparse layer)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    docs = qkdata.open_docs(args.data, args.docs)
    d0 = docs[0]
    spots = [spotfile.read(p) for p in args.spot]
    # Labels: spotlight-B, or with the file's name where two files have B bits (their rows would
    # otherwise merge).
    bit_counts = [s.bits for s in spots]
    labels = [f"spotlight-{s.bits}" if bit_counts.count(s.bits) == 1 else
              f"spotlight-{s.bits} ({p.rsplit('/', 1)[-1]})" for s, p in zip(spots, args.spot)]
    dense = ({int(x) for x in args.dense.split(",") if x} if args.dense
             else qkdata.engine_dense_layers(d0.n_layer_model))
    layers = ([int(x) for x in args.layers.split(",")] if args.layers
              else [layer for layer in d0.layers if layer not in dense])
    group = d0.n_head // d0.n_head_kv
    d = d0.head_dim
    rng = np.random.default_rng(args.seed)
    bit_set = sorted({s.bits for s in spots})
    planes = {b: rng.standard_normal((b, d)) for b in bit_set}
    lsh = rng.standard_normal((args.lsh_l * args.lsh_k, d))
    rows = []
    t0 = time.time()
    for layer in layers:
        per_doc = {}  # method -> list of (recall, iou) per document
        frac_doc = []
        for doc in docs:
            k = doc.centred_region_keys(layer).astype(np.float64)  # [kv][R][d]
            q_all = doc.queries(layer)[::args.query_stride].astype(np.float64)  # [Q][H][d]
            r = k.shape[1]
            top = max(1, int(np.ceil(args.top * r)))
            acc = {}
            mp_fracs = []
            for h in range(d0.n_head):
                kv = h // group
                q = q_all[:, h, :]
                s = q @ k[kv].T
                truth = qkdata.nearest(-s, top)
                # MagicPIG(K, L): >= 2 collisions.
                kc = qkdata.lsh_codes(k[kv], lsh, args.lsh_k)
                qc = qkdata.lsh_codes(q, lsh, args.lsh_k)
                ret = qkdata.collisions(qc, kc) >= 2
                mp_fracs.append(ret.mean())
                acc.setdefault(f"magicpig({args.lsh_k},{args.lsh_l})", []).append(scores(ret, truth))
                m_eq = max(1, int(round(ret.mean() * r)))
                cand = []
                for b in bit_set:
                    cand.append((f"simhash-{b}", qkdata.pack_bits(q @ planes[b].T),
                                 qkdata.pack_bits(k[kv] @ planes[b].T)))
                for sp, label in zip(spots, labels):
                    slot = sp.layers.index(layer)
                    cand.append((label,
                                 qkdata.pack_bits(spotfile.outputs64(sp.queries[slot][h], q)),
                                 qkdata.pack_bits(spotfile.outputs64(sp.keys[slot][kv], k[kv]))))
                for name, qb, kb in cand:
                    dist = qkdata.hamming(qb, kb)
                    acc.setdefault(f"{name} @top", []).append(
                        scores(qkdata.nearest(dist, top), truth))
                    acc.setdefault(f"{name} @mp", []).append(
                        scores(qkdata.nearest(dist, m_eq), truth))
            frac_doc.append(float(np.mean(mp_fracs)))
            for name, parts in acc.items():
                rec = np.concatenate([p[0] for p in parts]).mean()
                iou = np.concatenate([p[1] for p in parts]).mean()
                per_doc.setdefault(name, []).append((rec, iou))
        row = {"layer": layer, "magicpig_fraction": float(np.mean(frac_doc))}
        for name, vals in per_doc.items():
            v = np.array(vals)
            se = v.std(axis=0, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else np.zeros(2)
            row[name] = {"recall": float(v[:, 0].mean()), "recall_se": float(se[0]),
                         "iou": float(v[:, 1].mean()), "iou_se": float(se[1])}
        rows.append(row)
        print(f"layer {layer} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    names = [n for n in rows[0] if n not in ("layer", "magicpig_fraction")]
    print(f"top {args.top:.0%} of the offloaded keys; {len(docs)} held-out documents "
          f"({args.docs}), every {args.query_stride}th of {d0.n_queries} queries, all heads")
    print("\n| layer | MagicPIG fraction | " + " | ".join(f"{n} recall / IoU" for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for row in rows + [None]:
        if row is None:
            row = {"layer": "mean", "magicpig_fraction": np.mean([r["magicpig_fraction"] for r in rows])}
            for n in names:
                row[n] = {"recall": np.mean([r[n]["recall"] for r in rows]),
                          "iou": np.mean([r[n]["iou"] for r in rows]),
                          "recall_se": np.sqrt(np.mean([r[n]["recall_se"] ** 2 for r in rows]) / len(rows)),
                          "iou_se": 0.0}
        cells = [f"{row[n]['recall']:.3f} ± {row[n]['recall_se']:.3f} / {row[n]['iou']:.3f}"
                 for n in names]
        print(f"| {row['layer']} | {row['magicpig_fraction']:.2%} | " + " | ".join(cells) + " |")
    r_keys = d0.region()[1] - d0.region()[0]
    offset_bytes = 2 if r_keys < 65536 else 4
    print(f"\nindex bytes per key and kv head ({r_keys} keys): "
          + ", ".join(f"{b} bits: {b // 8}" for b in bit_set)
          + f"; magicpig({args.lsh_k},{args.lsh_l}): {2 * args.lsh_l} entries + "
          f"{args.lsh_l * ((1 << args.lsh_k) + 1) * offset_bytes / r_keys:.0f} offsets = "
          f"{2 * args.lsh_l + args.lsh_l * ((1 << args.lsh_k) + 1) * offset_bytes / r_keys:.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
