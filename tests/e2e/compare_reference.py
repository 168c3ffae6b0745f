#!/usr/bin/env python3
"""Compares magicpig's logits and greedy continuations with the float64 NumPy reference.

Usage: compare_reference.py MODEL FLOAT_DUMP_DIR Q8_DUMP_DIR N_PROMPTS GREEDY_TOKENS [q8-exact]
       (Q8_DUMP_DIR "-" checks the float run only, e.g. for synthetic models with float weights)

The reference (tests/reference/llama_reference.py) reads the GGUF with the PyPI `gguf` package and
runs everything in float64. magicpig runs twice (dumps from magicpig_dump_logits):

* `float`: weight products with float32 activations (MatMulFloatActivations). What remains is
  float32 arithmetic and the fp16 KV cache, so the bounds are tight:
    - relative L2 error of every position's logit vector <= 1e-2;
    - argmax agrees at every prompt position whose reference top-2 gap exceeds 0.05;
    - the greedy continuation of GREEDY_TOKENS tokens is identical.
* `q8`: the fast path (activations rounded to 8 bits per 32-value block before each integer
  product, as llama.cpp does). That rounding is discontinuous, so its noise accumulates over the 30
  layers and raw logits can move by tens of percent in directions the softmax ignores (a shift, the
  far tail). The bounds are on the next-token distribution instead:
    - KL(reference || ours) <= 0.1 nat at every position and <= 0.02 nat on average;
    - argmax agrees wherever the reference's top-2 gap exceeds 1.0 logit;
    - the max relative L2 error of the logits is reported;
    - the greedy continuation's agreement with the reference is reported (tokens until the
      first difference), not asserted: near-ties flip under that noise.
  With the last argument `q8-exact`, the q8 run is instead held to the reference computed with
  the same activation rounding (Reference(quantize_activations=True, fp16_kv=True)): KL <= 0.05
  nat at every position and <= 0.01 on average, argmax agreement where that reference's top-2 gap
  exceeds 1.0; its distance to the unrounded reference is reported, not asserted. This is for
  models where the rounding scheme itself moves some positions' distributions far (Qwen2.5's
  first position, whose massive activations lose everything else in their 256-value K-quant
  activation block: KL ~5.6 nat there for this reference and for magicpig alike), so that the
  check still pins the kernels to the documented arithmetic.
"""
import sys
import time

import numpy as np

from llama_reference import Reference


def rel_l2(a, b):
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


def load(dump, i, n_vocab):
    ids = [int(x) for x in open(f"{dump}/{i}.ids").read().split()]
    logits = np.fromfile(f"{dump}/{i}.logits", dtype=np.float32).reshape(len(ids), n_vocab)
    greedy = [int(x) for x in open(f"{dump}/{i}.greedy").read().split()]
    return ids, logits, greedy


def kl(ref, ours):
    def log_softmax(x):
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp, lq = log_softmax(ref), log_softmax(ours.astype(np.float64))
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def agree_where_decisive(ours, ref, gap):
    top2 = np.sort(ref, axis=1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > gap
    return bool(((ours.argmax(1) == ref.argmax(1)) | ~decisive).all())


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    model, float_dump, q8_dump = sys.argv[1], sys.argv[2], sys.argv[3]
    n_prompts, greedy_n = int(sys.argv[4]), int(sys.argv[5])
    q8_exact = len(sys.argv) > 6 and sys.argv[6] == "q8-exact"
    t0 = time.time()
    ref = Reference(model)
    print(f"reference loaded in {time.time() - t0:.1f}s")
    n_vocab = ref.w[ref.out_name].shape[0]
    ok = True
    for i in range(n_prompts):
        ids, ours_f, greedy_f = load(float_dump, i, n_vocab)
        ref.reset()
        expected = ref.forward(ids, all_logits=True)
        ref_greedy = ref.greedy(ids, greedy_n)

        err_f = rel_l2(ours_f, expected).max()
        agree_f = agree_where_decisive(ours_f, expected, 0.05)
        same_f = greedy_f == ref_greedy
        line = (f"prompt {i} ({len(ids)} tokens): float: max rel L2 {err_f:.1e}, argmax agree "
                f"{agree_f}, greedy {greedy_n} identical {same_f}")
        ok &= bool(err_f <= 1e-2) and agree_f and same_f
        if q8_dump != "-":
            ids_q, ours_q, greedy_q = load(q8_dump, i, n_vocab)
            assert ids == ids_q, "both runs must tokenise the same prompt identically"
            if q8_exact:
                ref.quantize_activations = ref.fp16_kv = True
                ref.reset()
                expected_q = ref.forward(ids, all_logits=True)
                ref.quantize_activations = ref.fp16_kv = False
                kl_same = kl(expected_q, ours_q)
                kl_exact = kl(expected, ours_q)
                agree_q = agree_where_decisive(ours_q, expected_q, 1.0)
                line += (f" | q8 vs the same rounding: KL max {kl_same.max():.4f} mean "
                         f"{kl_same.mean():.4f} nat, decisive argmax agree {agree_q}; vs "
                         f"unrounded: KL per position {np.round(kl_exact, 3).tolist()[:8]}"
                         f"{'...' if len(kl_exact) > 8 else ''}, greedy agrees for "
                         f"{common_prefix(greedy_q, ref_greedy)}/{greedy_n} tokens")
                ok &= bool(kl_same.max() <= 0.05) and bool(kl_same.mean() <= 0.01) and agree_q
                print(line)
                continue
            err_q = rel_l2(ours_q, expected).max()
            kl_q = kl(expected, ours_q)
            agree_q = agree_where_decisive(ours_q, expected, 1.0)
            prefix_q = common_prefix(greedy_q, ref_greedy)
            line += (f" | q8: KL max {kl_q.max():.3f} mean {kl_q.mean():.4f} nat, max rel L2 "
                     f"{err_q:.1e}, decisive argmax agree {agree_q}, greedy agrees for "
                     f"{prefix_q}/{greedy_n} tokens")
            ok &= bool(kl_q.max() <= 0.1) and bool(kl_q.mean() <= 0.02) and agree_q
        print(line)
        if not same_f:
            print(f"  float greedy: {greedy_f}\n  reference:    {ref_greedy}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
