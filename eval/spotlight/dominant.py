#!/usr/bin/env python3
"""How often a retrieval holds a query's top key: learned codes against MagicPIG's candidates.

For every sparse layer, query head and every 4th dumped query of the documents DOCS in DIR, the
key of highest exact score (centred keys, as the engine scores them) is looked up in (a) the keys
colliding with the query in >= 2 of 150 SimHash tables of 10 bits (seeded planes) and (b) the same
number of keys nearest by the 64-bit learned code of SPOT, and (c) their union. Reported over all queries and over the
queries whose top key carries softmax weight > 0.3 (a dominant key, as a needle is).

Usage: dominant.py DIR FIRST:END [SPOT]     (docs/vattention.md, Qwen 4K)
"""
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import qkdata  # noqa: E402
import spotfile  # noqa: E402

docs = qkdata.open_docs(sys.argv[1], sys.argv[2])
sp = spotfile.read(sys.argv[3] if len(sys.argv) > 3 else 'models/qwen2.5-coder-1.5b-64.spot')
rng = np.random.default_rng(7)
d0 = docs[0]; g = d0.n_head // d0.n_head_kv
lsh = rng.standard_normal((1500, d0.head_dim))
res = {'spot': [], 'mp': [], 'union': []}
for doc in docs:
    for layer in d0.layers:
        if layer in (0, d0.n_layer_model // 2): continue
        k = doc.centred_region_keys(layer).astype(np.float64)
        qa = doc.queries(layer)[::4].astype(np.float64)
        slot = sp.layers.index(layer)
        for h in range(d0.n_head):
            kv = h // g; q = qa[:, h, :]
            s = q @ k[kv].T
            top1 = s.argmax(1)
            # only queries whose top key dominates (softmax weight of top1 > 0.3)
            x = s / np.sqrt(d0.head_dim); w = np.exp(x - x.max(1, keepdims=True)); w /= w.sum(1, keepdims=True)
            dom = w[np.arange(len(q)), top1] > 0.3
            kc = qkdata.lsh_codes(k[kv], lsh, 10); qc = qkdata.lsh_codes(q, lsh, 10)
            hits = (qc[:, None, :] == kc[None, :, :]).sum(2)
            ret_mp = hits >= 2
            m = max(1, int(round(ret_mp.mean() * k.shape[1])))
            dist = qkdata.hamming(qkdata.pack_bits(spotfile.outputs64(sp.queries[slot][h], q)),
                                  qkdata.pack_bits(spotfile.outputs64(sp.keys[slot][kv], k[kv])))
            ret_sp = qkdata.nearest(dist, m)
            for name, r in (('spot', ret_sp), ('mp', ret_mp), ('union', ret_sp | ret_mp)):
                got = r[np.arange(len(q)), top1]
                res[name].append((got[dom].sum(), dom.sum(), got.sum(), len(q)))
for name, v in res.items():
    v = np.array(v).sum(0)
    print(name, f"top-1 key retrieved: dominant queries {v[0]}/{v[1]} = {v[0]/max(1,v[1]):.3f}; all {v[2]}/{v[3]} = {v[2]/v[3]:.3f}")
