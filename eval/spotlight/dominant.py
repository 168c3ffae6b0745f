#!/usr/bin/env python3
"""How often a retrieval holds a query's top key: learned codes against MagicPIG's candidates.

For every sparse layer, query head and every --query-stride-th (4th) dumped query of the documents
FIRST:END in DIR, the key of highest exact score (centred keys, as the engine scores them) is looked
up in (a) the keys colliding with the query in >= 2 of 150 SimHash tables of 10 bits (seeded planes:
what MagicPIG(10, 150) samples), (b) as many keys nearest by the learned code of SPOT, (b') as many
by finer scorings of the same key bits: asymmetric (the query's tanh outputs rounded to int8 against
the key's signs), two-level (query weight 2 on its more confident half of the bits, 1 on the rest),
masked (0 on the rest), and relaxed (tanh of both sides' outputs, the trainer's score: not a
storable code, the bound for any code of these MLPs), and (c) the union of (a) and (b), and with
RERANK > 1 (d) as many keys kept by exact score out of RERANK times as many nearest
by learned code (spotlight's rescoring, --spotlight-rerank) and (e) top-k by exact score at that
count, and with --sketch R,... (f) as many keys of highest score by a low-rank sketch: each kv
head's keys projected on their own R leading principal directions (of the dumped region) and rounded
to int8 per direction (R bytes per key), scored against the query's projection, and (g) the m best
by that sketch among the 8m nearest by learned code. Reported over all queries and over the queries
whose top key carries softmax weight > 0.3 (a dominant key, as a needle is), and the softmax weight
each retrieval holds (mean over queries).

Usage: dominant.py DIR FIRST:END [SPOT|- [RERANK]] [--sketch R,...] [--sketch-fit 1]
                   [--query-stride 4]
       (docs/vattention.md, docs/spotlight.md; Qwen 4K)
"""

import argparse
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import qkdata  # noqa: E402
import spotfile  # noqa: E402

LSH_K, LSH_L = 10, 150
DOMINANT = 0.3


def sketch(k, dims, fit_fraction=1.0):
    """(u [d][dims], sketch [R][dims]): the `dims` leading principal directions of the first
    `fit_fraction` of k's rows (as a shard that fixes its basis at offload and keeps it for keys
    appended later) and k's coordinates on them rounded to int8 per direction; q . k ~ (q u) .
    sketch."""
    _, _, vt = np.linalg.svd(k[:max(dims, int(fit_fraction * len(k)))], full_matrices=False)
    u = vt[:dims].T
    kp = k @ u
    scale = np.abs(kp).max(axis=0) / 127
    scale[scale == 0] = 1
    return u, np.round(kp / scale) * scale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("docs")
    ap.add_argument("spot", nargs="?", default="models/qwen2.5-coder-1.5b-64.spot",
                    help="trained hashes, or - for none (MagicPIG, top-k and the sketches only)")
    ap.add_argument("rerank", nargs="?", type=int, default=1)
    ap.add_argument("--sketch", default="", help="comma list of sketch dimensions")
    ap.add_argument("--query-stride", type=int, default=4)
    ap.add_argument("--sketch-fit", type=float, default=1.0,
                    help="fit the sketch's directions on this leading fraction of the keys")
    args = ap.parse_args()
    docs = qkdata.open_docs(args.dir, args.docs)
    sp = spotfile.read(args.spot) if args.spot != "-" else None
    rerank = args.rerank if sp is not None else 1
    sketches = [int(x) for x in args.sketch.split(",") if x]
    d0 = docs[0]
    group = d0.n_head // d0.n_head_kv
    rng = np.random.default_rng(7)
    lsh = rng.standard_normal((LSH_L * LSH_K, d0.head_dim))
    names = (["spotlight", "spotlight asymmetric", "spotlight two-level", "spotlight masked",
              "spotlight relaxed (not storable)", "magicpig", "union"] if sp is not None
             else ["magicpig", "top-k"])
    rescored = f"spotlight rescored from {rerank}x"
    if rerank > 1:
        names += [rescored, "top-k"]
    for r in sketches:
        names += [f"sketch-{r} (top by sketch)"]
        if sp is not None:
            names += [f"spotlight 8x rescored by sketch-{r}"]
    # method -> [top key held for dominant queries, dominant queries, held for all, all]
    totals = {name: np.zeros(4, np.int64) for name in names}
    mass = {name: 0.0 for name in names}  # softmax weight held, summed over queries
    dense = qkdata.engine_dense_layers(d0.n_layer_model)
    for doc in docs:
        for layer in (layer for layer in d0.layers
                      if layer not in dense and (sp is None or layer in sp.layers)):
            keys = doc.centred_region_keys(layer).astype(np.float64)  # [kv][R][d]
            queries = doc.queries(layer)[::args.query_stride].astype(np.float64)  # [Q][H][d]
            slot = sp.layers.index(layer) if sp is not None else -1
            for kv in range(d0.n_head_kv):
                k = keys[kv]
                key_lsh = qkdata.lsh_codes(k, lsh, LSH_K)
                key_code = key_sign = key_t = None
                if sp is not None:
                    key_z = spotfile.outputs64(sp.keys[slot][kv], k)
                    key_code = qkdata.pack_bits(key_z)
                    key_sign = np.where(key_z > 0, 1.0, -1.0)
                    key_t = np.tanh(key_z)  # the relaxed key side, shared by the group's heads
                key_sketch = {r: sketch(k, r, args.sketch_fit) for r in sketches}
                for h in range(kv * group, (kv + 1) * group):
                    q = queries[:, h, :]
                    x = q @ k.T / np.sqrt(d0.head_dim)
                    top = x.argmax(1)
                    w = np.exp(x - x.max(1, keepdims=True))
                    dominant = (w[np.arange(len(q)), top] / w.sum(1)) > DOMINANT
                    mp = qkdata.collisions(qkdata.lsh_codes(q, lsh, LSH_K), key_lsh) >= 2
                    m = max(1, int(round(mp.mean() * len(k))))
                    if sp is not None:
                        q_z = spotfile.outputs64(sp.queries[slot][h], q)
                        q_code = qkdata.pack_bits(q_z)
                        dist = qkdata.hamming(q_code, key_code)
                        learned = qkdata.nearest(dist, m)
                        # Asymmetric: the key's signs against the query's relaxed outputs
                        # tanh(z_q) (the trainer's agreement with the key side saturated), the
                        # query's weights rounded to int8 as a kernel would hold them.
                        t_q = np.tanh(q_z)
                        tq = np.round(t_q / np.abs(t_q).max(1, keepdims=True) * 127)
                        asym = qkdata.nearest(-(tq @ key_sign.T), m)
                        # Two levels: weight 2 on the query's more confident half of the bits
                        # (|z_q| above its median), 1 on the rest; masked: weight 0 on the rest.
                        conf = np.abs(q_z) > np.median(np.abs(q_z), axis=1, keepdims=True)
                        qs = np.where(q_z > 0, 1.0, -1.0)
                        two = qkdata.nearest(-((qs * (1.0 + conf)) @ key_sign.T), m)
                        masked = qkdata.nearest(-((qs * conf) @ key_sign.T), m)
                        # The trainer's own score, both sides relaxed (keys not binarised): what
                        # the MLPs rank before any code is stored.
                        relaxed = qkdata.nearest(-(t_q @ key_t.T), m)
                        rets = [("spotlight", learned), ("spotlight asymmetric", asym),
                                ("spotlight two-level", two), ("spotlight masked", masked),
                                ("spotlight relaxed (not storable)", relaxed),
                                ("magicpig", mp), ("union", learned | mp)]
                    else:
                        rets = [("magicpig", mp), ("top-k", qkdata.nearest(-x, m))]
                    if rerank > 1:
                        # The m best by exact score among the rerank * m nearest by code.
                        near = qkdata.nearest(dist, min(len(k), rerank * m))
                        rets += [(rescored, qkdata.nearest(np.where(near, -x, np.inf), m)),
                                 ("top-k", qkdata.nearest(-x, m))]
                    if sketches and sp is not None:
                        near8 = qkdata.nearest(dist, min(len(k), 8 * m))  # what sketches rescore
                    for r in sketches:
                        u, ks = key_sketch[r]
                        sk = (q @ u) @ ks.T
                        rets.append((f"sketch-{r} (top by sketch)", qkdata.nearest(-sk, m)))
                        if sp is not None:
                            rets.append((f"spotlight 8x rescored by sketch-{r}",
                                         qkdata.nearest(np.where(near8, -sk, np.inf), m)))
                    p = w / w.sum(1, keepdims=True)
                    for name, ret in rets:
                        held = ret[np.arange(len(q)), top]
                        totals[name] += [held[dominant].sum(), dominant.sum(), held.sum(), len(q)]
                        mass[name] += float((p * ret).sum())
    for name, (hd, nd, ha, na) in totals.items():
        print(f"{name}: top key held for {hd}/{nd} = {hd / max(1, nd):.3f} of the dominant "
              f"queries, {ha}/{na} = {ha / na:.3f} of all; softmax weight held "
              f"{mass[name] / na:.3f}")


if __name__ == "__main__":
    main()
