#!/usr/bin/env python3
"""Writes the spotlight loader's fuzz seeds (tests/fuzz/corpus/spot): small valid .spot files
(eval/spotlight/spotfile.py's writer) of a few shapes.

Usage: spot_seed_gen.py SOURCE_DIR
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(sys.argv[1], "eval", "spotlight"))
import spotfile  # noqa: E402


def main():
    dest = os.path.join(sys.argv[1], "tests/fuzz/corpus/spot")
    os.makedirs(dest, exist_ok=True)
    rng = np.random.default_rng(1)
    for name, (d, bits, n_layer, n_head, n_kv, layers) in {
            "tiny": (4, 16, 2, 2, 1, [1]),
            "two-layers": (8, 32, 4, 4, 2, [0, 3]),
            "wide-code": (4, 64, 1, 1, 1, [0])}.items():
        def mlp():
            return spotfile.Mlp(0.5, rng.standard_normal((d, d)), rng.standard_normal(d),
                                rng.standard_normal((bits, d)), rng.standard_normal(bits))
        f = spotfile.SpotFile(d, bits, n_layer, n_head, n_kv, "seed", layers,
                              [[mlp() for _ in range(n_kv)] for _ in layers],
                              [[mlp() for _ in range(n_head)] for _ in layers])
        spotfile.write(os.path.join(dest, name), f)
    print(f"wrote 3 seeds to {dest}")


if __name__ == "__main__":
    main()
