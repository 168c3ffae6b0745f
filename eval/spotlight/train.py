#!/usr/bin/env python3
"""Trains Spotlight hash MLPs (one per kv head for keys, one per query head for queries, per layer)
on query/key dumps, and writes the .spot file that `--attention spotlight` loads.

Objective (Spotlight Attention, Li et al.): a Bradley-Terry ranking loss per query. For a query q
with a true top-`--top`-fraction key k+ (by exact score q . k, over the centred offloaded keys) and
another key k-, loss = softplus(tau * (s(q, k-) - s(q, k+))), where s is the relaxed code agreement
s = mean_i tanh(z_q,i) tanh(z_k,i) in [-1, 1] (the sign codes' 1 - 2 * Hamming / bits when the
outputs saturate). Half the k- are uniform over the keys outside the top set, half from the next
ranks (top .. 5 x top), where the ranking is decided. AdamW, cosine learning-rate decay. Gradients
are written out by hand (NumPy only, no torch): tests/spotlight/trainer_test.py checks them against
finite differences.

The MLPs start as SimHash: W1 = 0, b1 = 0 (so h = x' + silu(0) = x'), W2 Gaussian, b2 = 0, so
training starts from random hyperplanes of the same bit count and moves away from them only where
the ranking loss improves.

Usage: train.py --data DIR --docs 0:96 --out FILE [--bits 64] [--model GGUF] [--steps 1000]
                [--batch 128] [--pairs 16] [--top 0.02] [--lr 1e-2] [--seed 1] [--layers all]
                [--jobs 2]
"""

import argparse
import functools
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import qkdata  # noqa: E402
import spotfile  # noqa: E402


def init_params(rng, h, d, bits, w2_scale=1.0):
    return {
        "w1": np.zeros((h, d, d), np.float32),
        "b1": np.zeros((h, d), np.float32),
        "w2": (w2_scale * rng.standard_normal((h, bits, d))).astype(np.float32),
        "b2": np.zeros((h, bits), np.float32),
    }


def forward(p, scale, x):
    """x [H][N][d] -> tanh outputs t [H][N][bits] and the cache for backward."""
    xs = x * scale[:, None, None]
    a = np.matmul(xs, p["w1"].transpose(0, 2, 1)) + p["b1"][:, None, :]
    sg = 1.0 / (1.0 + np.exp(-a))
    h = xs + a * sg
    z = np.matmul(h, p["w2"].transpose(0, 2, 1)) + p["b2"][:, None, :]
    t = np.tanh(z)
    return t, (xs, a, sg, h, t)


def backward(p, cache, dt):
    xs, a, sg, h, t = cache
    dz = dt * (1.0 - t * t)
    g = {"w2": np.matmul(dz.transpose(0, 2, 1), h), "b2": dz.sum(axis=1)}
    dh = np.matmul(dz, p["w2"])
    da = dh * (sg * (1.0 + a * (1.0 - sg)))
    g["w1"] = np.matmul(da.transpose(0, 2, 1), xs)
    g["b1"] = da.sum(axis=1)
    return g


def softplus(u):
    return np.logaddexp(0.0, u)


def loss_and_grads(pq, pk, sq, sk, group, q, kpos, kneg, tau):
    """q [H][B][d], kpos / kneg [H][B][P][d] (H query heads; key MLP of query head h is
    pk[h // group]). Returns the mean loss and the gradients of pq and pk."""
    hq, b, npair, d = kpos.shape
    rep = lambda p: {n: np.repeat(v, group, axis=0) for n, v in p.items()}  # noqa: E731
    pk_rep = rep(pk)
    sk_rep = np.repeat(sk, group)
    tq, cq = forward(pq, sq, q)
    keys = np.concatenate([kpos, kneg], axis=2).reshape(hq, b * 2 * npair, d)
    tk, ck = forward(pk_rep, sk_rep, keys)
    bits = tq.shape[-1]
    tk4 = tk.reshape(hq, b, 2 * npair, bits)
    tkp, tkn = tk4[:, :, :npair], tk4[:, :, npair:]
    sp = np.einsum("hbk,hbpk->hbp", tq, tkp) / bits
    sn = np.einsum("hbk,hbpk->hbp", tq, tkn) / bits
    u = tau * (sn - sp)
    count = u.size
    loss = softplus(u).mean()
    dsn = tau / (1.0 + np.exp(-u)) / count
    dtq = (np.einsum("hbp,hbpk->hbk", dsn, tkn) - np.einsum("hbp,hbpk->hbk", dsn, tkp)) / bits
    dtk = np.concatenate([-dsn[..., None] * tq[:, :, None, :], dsn[..., None] * tq[:, :, None, :]],
                         axis=2) / bits
    gq = backward(pq, cq, dtq)
    gk_rep = backward(pk_rep, ck, dtk.reshape(hq, b * 2 * npair, bits))
    n_kv = hq // group
    gk = {n: v.reshape((n_kv, group) + v.shape[1:]).sum(axis=1) for n, v in gk_rep.items()}
    return loss, gq, gk


class AdamW:
    def __init__(self, params, lr, wd=1e-4, b1=0.9, b2=0.999, eps=1e-8):
        self.p, self.lr, self.wd, self.b1, self.b2, self.eps = params, lr, wd, b1, b2, eps
        self.m = [{n: np.zeros_like(v) for n, v in p.items()} for p in params]
        self.v = [{n: np.zeros_like(v) for n, v in p.items()} for p in params]
        self.t = 0

    def step(self, grads, lr):
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t
        for p, g, m, v in zip(self.p, grads, self.m, self.v):
            for n in p:
                m[n] = self.b1 * m[n] + (1 - self.b1) * g[n]
                v[n] = self.b2 * v[n] + (1 - self.b2) * g[n] * g[n]
                if n.startswith("w"):
                    p[n] *= 1 - lr * self.wd
                p[n] -= (lr * (m[n] / c1) / (np.sqrt(v[n] / c2) + self.eps)).astype(np.float32)


class LayerData:
    """One layer's training data: centred offloaded keys and queries of every document, and for
    each (document, query head, query) its top keys (ranks < top) and next keys (ranks < 5 top)."""

    def __init__(self, docs, layer, top_frac, group):
        self.keys = np.stack([d.centred_region_keys(layer) for d in docs])  # [D][kv][R][d]
        self.q = np.stack([np.ascontiguousarray(d.queries(layer).transpose(1, 0, 2))
                           for d in docs]).astype(np.float32)  # [D][H][Q][d]
        n_doc, n_kv, r, _ = self.keys.shape
        hq, nq = self.q.shape[1], self.q.shape[2]
        self.top = max(1, int(np.ceil(top_frac * r)))
        self.band = min(r - self.top, 4 * self.top)
        self.order = np.empty((n_doc, hq, nq, self.top + self.band), np.int32)
        for i in range(n_doc):
            kk = np.repeat(self.keys[i], group, axis=0)  # [H][R][d]
            s = np.matmul(self.q[i], kk.transpose(0, 2, 1))  # [H][Q][R]
            part = np.argpartition(-s, self.top + self.band - 1, axis=2)[:, :, :self.top + self.band]
            ps = np.take_along_axis(s, part, axis=2)
            self.order[i] = np.take_along_axis(part, np.argsort(-ps, axis=2), axis=2)
        self.group = group
        self.r = r

    def batch(self, rng, b, pairs):
        """q [H][B][d], kpos [H][B][P][d], kneg [H][B][P][d]."""
        n_doc, hq, nq, _ = self.order.shape
        doc = rng.integers(0, n_doc, b)
        j = rng.integers(0, nq, b)
        o = self.order[doc, :, j]  # [B][H][top + band]
        pos = np.take_along_axis(o, rng.integers(0, self.top, (b, hq, pairs)), axis=2)
        half = pairs // 2
        near = np.take_along_axis(o, self.top + rng.integers(0, max(1, self.band), (b, hq, half)),
                                  axis=2)
        far = rng.integers(0, self.r, (b, hq, pairs - half))  # rarely a top key: negligible
        neg = np.concatenate([near, far], axis=2)
        kv = (np.arange(hq) // self.group)[None, :, None]
        q = self.q[doc, :, j].transpose(1, 0, 2)  # [H][B][d]
        kpos = self.keys[doc[:, None, None], kv, pos].transpose(1, 0, 2, 3)
        kneg = self.keys[doc[:, None, None], kv, neg].transpose(1, 0, 2, 3)
        return q, kpos, kneg


def train_layer(data, bits, steps, batch, pairs, lr, tau, rng, log, w2_scale=1.0):
    n_kv, d = data.keys.shape[1], data.keys.shape[3]
    hq = data.q.shape[1]
    sq = (1.0 / np.sqrt((data.q.astype(np.float64) ** 2).sum(-1).mean(axis=(0, 2)))).astype(
        np.float32)
    sk = (1.0 / np.sqrt((data.keys.astype(np.float64) ** 2).sum(-1).mean(axis=(0, 2)))).astype(
        np.float32)
    pq = init_params(rng, hq, d, bits, w2_scale)
    pk = init_params(rng, n_kv, d, bits, w2_scale)
    opt = AdamW([pq, pk], lr)
    first = last = None
    for step in range(steps):
        q, kpos, kneg = data.batch(rng, batch, pairs)
        loss, gq, gk = loss_and_grads(pq, pk, sq, sk, data.group, q, kpos, kneg, tau)
        opt.step([gq, gk], lr * 0.5 * (1 + np.cos(np.pi * step / steps)))
        first = loss if first is None else first
        last = loss if last is None else 0.9 * last + 0.1 * loss
    log(f"loss {first:.4f} -> {last:.4f}")
    return pq, pk, sq, sk


def train_one_layer(args, t0, layer):
    """Trains one layer's MLPs (its own random stream, so any --jobs gives the same draws)."""
    docs = qkdata.open_docs(args.data, args.docs)
    group = docs[0].n_head // docs[0].n_head_kv
    t1 = time.time()
    data = LayerData(docs, layer, args.top, group)
    return train_layer(
        data, args.bits, args.steps, args.batch, args.pairs, args.lr, args.tau,
        np.random.default_rng([args.seed, layer]),
        lambda m: print(f"layer {layer}: {m} ({time.time() - t1:.0f} s, {time.time() - t0:.0f} s "
                        "in all)", flush=True),
        args.w2_scale)


def gguf_name(path):
    try:
        import gguf  # the venv's gguf package
        r = gguf.GGUFReader(path)
        f = r.fields.get("general.name")
        return bytes(f.parts[f.data[0]]).decode("utf-8") if f is not None else ""
    except Exception as e:  # noqa: BLE001 - a name is a check, not a requirement
        print(f"warning: no model name from {path}: {e}", file=sys.stderr)
        return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--docs", default="0:96")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bits", type=int, default=64)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--top", type=float, default=0.02)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--tau", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--w2-scale", type=float, default=1.0,
                    help="std of W2's initial entries (inputs are scaled to unit mean norm)")
    ap.add_argument("--layers", default="all", help="comma list of model layers, or all")
    ap.add_argument("--jobs", type=int, default=2, help="layers trained at once (processes)")
    args = ap.parse_args(argv)
    if args.bits % 16 or not 16 <= args.bits <= 256:
        raise SystemExit("--bits must be a multiple of 16 in [16, 256]")
    d0 = qkdata.open_docs(args.data, args.docs)[0]
    layers = d0.layers if args.layers == "all" else [int(x) for x in args.layers.split(",")]
    t0 = time.time()
    if args.jobs > 1:
        # One layer per worker process, each with a one-thread BLAS: on 2 cores two layers at
        # once train ~1.5x faster than one at a time on OpenBLAS's two threads (Qwen2.5-1.5B,
        # 1,000 steps: 182 s per pair of layers against ~140 s per layer), whose threads gain
        # little on the backward pass's products over the 4,096 keys of a batch.
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            trained = pool.map(functools.partial(train_one_layer, args, t0), layers, chunksize=1)
    else:
        trained = [train_one_layer(args, t0, layer) for layer in layers]
    mk = lambda p, s, i: spotfile.Mlp(s[i], p["w1"][i], p["b1"][i], p["w2"][i], p["b2"][i])  # noqa: E731
    keys = [[mk(pk, sk, i) for i in range(d0.n_head_kv)] for _, pk, _, sk in trained]
    queries = [[mk(pq, sq, i) for i in range(d0.n_head)] for pq, _, sq, _ in trained]
    name = gguf_name(args.model) if args.model else ""
    spotfile.write(args.out, spotfile.SpotFile(d0.head_dim, args.bits, d0.n_layer_model, d0.n_head,
                                               d0.n_head_kv, name, layers, keys, queries))
    print(f"wrote {args.out}: {len(layers)} layers, {args.bits} bits, model '{name}' "
          f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
