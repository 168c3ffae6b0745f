#!/usr/bin/env python3
"""The C++ Spotlight forward (SpotlightHashes) against eval/spotlight/spotfile.py's float64 NumPy
reference, at every SIMD level.

    numpy_reference_test.py PATH/TO/spotlight_codes_tool

Writes random .spot files with spotfile.write (several head_dim/bits shapes), runs the tool on
random rows and checks, for every MLP: the codes equal spotfile.pack(outputs64) wherever
|z64| > 1e-4 * max|z64|, and z is within 1e-4 * max|z64| of z64. Runs with the project's .venv
Python when the current one lacks numpy; exit 77 (CTest SKIP) when neither has it.
"""

import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("MAGICPIG_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))

try:
    import numpy as np
except ImportError:
    venv = os.path.join(SRC, ".venv")
    venv_py = os.path.join(venv, "bin", "python")
    if os.path.exists(venv_py) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(venv_py, [venv_py] + sys.argv)
    print("SKIP: numpy not found (scripts/python-env creates .venv)")
    sys.exit(77)

sys.path.insert(0, os.path.join(SRC, "eval", "spotlight"))
import spotfile  # noqa: E402


def random_spot(rng, d, bits, n_layer_model, n_head, n_head_kv, layers):
    keys, queries = [], []
    for _ in layers:
        mlps = []
        for _ in range(n_head_kv + n_head):
            mlps.append(spotfile.Mlp(
                rng.uniform(0.3, 1.5),
                rng.normal(0, 2 / np.sqrt(d), (d, d)),
                rng.normal(0, 0.5, d),
                rng.normal(0, 1 / np.sqrt(d), (bits, d)),
                rng.normal(0, 0.1, bits)))
        keys.append(mlps[:n_head_kv])
        queries.append(mlps[n_head_kv:])
    return spotfile.SpotFile(d, bits, n_layer_model, n_head, n_head_kv, "numpy test", layers, keys,
                             queries)


def check(tool, tmp, rng, d, bits, n):
    spot = random_spot(rng, d, bits, 6, 4, 2, [1, 5])
    path = os.path.join(tmp, f"s{d}_{bits}.spot")
    spotfile.write(path, spot)
    back = spotfile.read(path)  # the writer and reader agree before the C++ side is asked
    assert back.layers == spot.layers and back.bits == bits
    x = (rng.normal(0, 2, (n, d))).astype(np.float32)
    x_path = os.path.join(tmp, "x.f32")
    x.astype("<f4").tofile(x_path)
    mlps = [m for slot in range(len(spot.layers)) for m in
            list(spot.keys[slot]) + list(spot.queries[slot])]
    failures = []
    for level in ("scalar", "avx2", "avx512"):
        codes_path = os.path.join(tmp, "codes.u16")
        z_path = os.path.join(tmp, "z.f32")
        out = subprocess.run([tool, path, x_path, str(n), level, codes_path, z_path],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"tool failed: {out.stderr}")
        used = out.stdout.split()[-1]
        words = bits // 16
        codes = np.fromfile(codes_path, dtype="<u2").reshape(len(mlps), n, words)
        z = np.fromfile(z_path, dtype="<f4").reshape(len(mlps), n, bits)
        for i, mlp in enumerate(mlps):
            z64 = spotfile.outputs64(mlp, x)
            scale = np.abs(z64).max()
            err = np.abs(z[i] - z64).max()
            if err > 1e-4 * scale:
                failures.append(f"{used} d={d} bits={bits} mlp {i}: max |z - z64| = {err:.3g} "
                                f"(scale {scale:.3g})")
            sure = np.abs(z64) > 1e-4 * scale
            bits_cpp = ((codes[i][:, :, None] >> np.arange(16, dtype=np.uint16)) & 1).reshape(
                n, bits)
            bits_ref = (z64 > 0).astype(np.uint16)
            wrong = np.count_nonzero((bits_cpp != bits_ref) & sure)
            if wrong:
                failures.append(f"{used} d={d} bits={bits} mlp {i}: {wrong} bits differ")
            # Where every bit is sure, the packed words are spotfile.pack's exactly.
            rows = sure.all(axis=1)
            if not np.array_equal(codes[i][rows], spotfile.pack(z64)[rows]):
                failures.append(f"{used} d={d} bits={bits} mlp {i}: packed words differ")
        print(f"{used}: d={d} bits={bits} n={n}: {len(mlps)} MLPs checked")
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: numpy_reference_test.py PATH/TO/spotlight_codes_tool")
    tool = sys.argv[1]
    rng = np.random.default_rng(2024)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for d, bits, n in ((64, 64, 131), (24, 48, 70), (7, 16, 9), (32, 256, 40)):
            failures += check(tool, tmp, rng, d, bits, n)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
