"""Reads query/key dumps (magicpig_dump_qk, format in eval/qk_dump.h) for the spotlight tools.

A document's keys are centred as the engine centres them (the mean key of the offloaded region, per
kv head); every query of the document is scored against the same offloaded region: keys
[SINKS, n_tokens - n_queries - LOCAL), the keys that a decode step at the first dumped query
position would find on the attention shards (the engine keeps 4 sinks and 64 local tokens exact).
"""

import glob
import os
import struct
import sys

import numpy as np

MAGIC = b"MPQKDMP1"
SINKS = 4
LOCAL = 64


class Dump:
    """One dump file, memory-mapped; layer data are read on demand."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            head = f.read(8 + 8 * 8)
            if len(head) < 72 or head[:8] != MAGIC:
                raise ValueError(f"{path}: not a query/key dump")
            (self.n_tokens, self.n_queries, self.n_head, self.n_head_kv, self.head_dim,
             self.n_layer_model, n_layers, self.has_values) = struct.unpack_from("<8q", head, 8)
            self.layers = list(struct.unpack("<%dq" % n_layers, f.read(8 * n_layers)))
        off = 72 + 8 * n_layers + 4 * self.n_tokens
        self.offsets = {}
        kv = self.n_tokens * self.n_head_kv * self.head_dim * 4
        qs = self.n_queries * self.n_head * self.head_dim * 4
        for layer in self.layers:
            k_off = off
            off += kv * (2 if self.has_values else 1)
            self.offsets[layer] = (k_off, off)
            off += qs
        if os.path.getsize(path) != off:
            raise ValueError(f"{path}: size {os.path.getsize(path)}, header says {off}")
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")

    def keys(self, layer):
        """[n_tokens][n_head_kv][head_dim] float32."""
        k_off, _ = self.offsets[layer]
        n = self.n_tokens * self.n_head_kv * self.head_dim
        return np.frombuffer(self.mm, dtype="<f4", count=n, offset=k_off).reshape(
            self.n_tokens, self.n_head_kv, self.head_dim)

    def queries(self, layer):
        """[n_queries][n_head][head_dim] float32 (positions n_tokens - n_queries ...)."""
        _, q_off = self.offsets[layer]
        n = self.n_queries * self.n_head * self.head_dim
        return np.frombuffer(self.mm, dtype="<f4", count=n, offset=q_off).reshape(
            self.n_queries, self.n_head, self.head_dim)

    def region(self):
        return SINKS, self.n_tokens - self.n_queries - LOCAL

    def centred_region_keys(self, layer):
        """[n_head_kv][R][head_dim] float32: the offloaded region's keys minus their mean."""
        lo, hi = self.region()
        k = np.ascontiguousarray(self.keys(layer)[lo:hi].transpose(1, 0, 2), dtype=np.float32)
        return k - k.mean(axis=1, keepdims=True)


def lsh_codes(x, planes, k_bits):
    """x [n][d], planes [L * K][d] -> [n][L] int64 SimHash codes: bit b of table t is
    x . planes[t * K + b] > 0."""
    pow2 = (1 << np.arange(k_bits)).astype(np.int64)
    return ((x @ planes.T) > 0).reshape(len(x), -1, k_bits) @ pow2


def collisions(qc, kc):
    """qc [Q][L], kc [R][L] SimHash codes -> [Q][R] int32: tables in which each key collides with
    each query (MagicPIG samples the keys with >= 2)."""
    hits = np.zeros((len(qc), len(kc)), np.int32)
    for t in range(qc.shape[1]):
        hits += qc[:, t][:, None] == kc[:, t][None, :]
    return hits


def engine_dense_layers(n_layer):
    """The layers the engine keeps exact by default (SparseAttentionOptions::dense_layers)."""
    return {0, n_layer // 2}


POP8 = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def pack_bits(z):
    """[..., bits] bool/float (> 0) -> [..., bits / 8] uint8, bit i of the code = z_i > 0."""
    return np.packbits(np.asarray(z) > 0, axis=-1, bitorder="little")


def hamming(qc, kc):
    """qc [Q][nb] uint8, kc [R][nb] uint8 -> [Q][R] distances."""
    return POP8[qc[:, None, :] ^ kc[None, :, :]].sum(axis=2, dtype=np.int32)


def nearest(dist, m):
    """Boolean [Q][R]: the m smallest distances per row, ties by lower index."""
    order = np.argsort(dist, axis=1, kind="stable")[:, :m]
    out = np.zeros(dist.shape, bool)
    np.put_along_axis(out, order, True, axis=1)
    return out


def open_docs(data_dir, spec):
    """Dumps doc{i:04d}.qk for i in the ranges of spec: "a:b" (end exclusive), or several joined
    by commas ("0:32,40:52")."""
    idx = []
    for part in spec.split(","):
        a, b = (int(x) for x in part.split(":"))
        idx.extend(range(a, b))
    if not idx:
        raise SystemExit(f"no documents in {spec!r}")
    paths = [os.path.join(data_dir, f"doc{i:04d}.qk") for i in idx]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        have = len(glob.glob(os.path.join(data_dir, "doc*.qk")))
        raise SystemExit(f"{missing[0]} missing ({have} dumps in {data_dir}; run collect.py)")
    return [Dump(p) for p in paths]


def model_tokenizer(model_path):
    """The model's own tokenizer (Hugging Face `tokenizers` built from the GGUF's vocabulary by
    tests/tokenizer/hf_reference.py), for sizing texts in tokens."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "tests", "tokenizer"))
    import hf_reference  # noqa: E402

    return hf_reference.build(model_path)
