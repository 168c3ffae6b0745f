"""Spotlight hash files (.spot): the trained per-head MLP hashes that `--attention spotlight` loads.

One file holds, for each hashed layer of one model, a key MLP per kv head and a query MLP per query
head. Each MLP maps a head_dim vector x to `bits` outputs:

    x' = in_scale * x
    h  = x' + silu(W1 x' + b1)          (residual layer of width head_dim)
    z  = W2 h + b2                      (linear map to `bits` outputs)
    code bit i = 1 if z_i > 0 else 0

Codes are packed into uint16 words, bit i in word i // 16 at position i % 16 (LSB first), so a
code is bits / 16 words: the [n][L] uint16 layout the attention library already moves for SimHash.

File layout (little-endian), version 1:
    char    magic[8] = b"MPSPOT01"
    uint32  version (= 1), head_dim, bits, n_layer_model, n_head, n_head_kv, n_layers
    uint32  name_len; bytes model_name[name_len]      (GGUF general.name; may be empty)
    uint32  layers[n_layers]                          (strictly increasing, < n_layer_model)
    per listed layer: n_head_kv key MLPs, then n_head query MLPs, each:
        float32 in_scale; float32 w1[head_dim][head_dim]; float32 b1[head_dim];
        float32 w2[bits][head_dim]; float32 b2[bits]
    uint32  crc32 (zlib CRC-32 of every byte before it)

bits is a multiple of 16 in [16, 256]; head_dim in [1, 1024].
"""

import struct
import zlib

import numpy as np

MAGIC = b"MPSPOT01"
VERSION = 1


class Mlp:
    """One head's hash MLP (float32 arrays)."""

    def __init__(self, in_scale, w1, b1, w2, b2):
        self.in_scale = np.float32(in_scale)
        self.w1 = np.ascontiguousarray(w1, dtype=np.float32)
        self.b1 = np.ascontiguousarray(b1, dtype=np.float32)
        self.w2 = np.ascontiguousarray(w2, dtype=np.float32)
        self.b2 = np.ascontiguousarray(b2, dtype=np.float32)


class SpotFile:
    """layers: list of model layer indices; keys[slot][kv_head], queries[slot][head]: Mlp."""

    def __init__(self, head_dim, bits, n_layer_model, n_head, n_head_kv, model_name, layers,
                 keys, queries):
        self.head_dim = head_dim
        self.bits = bits
        self.n_layer_model = n_layer_model
        self.n_head = n_head
        self.n_head_kv = n_head_kv
        self.model_name = model_name
        self.layers = list(layers)
        self.keys = keys
        self.queries = queries


def write(path, spot):
    out = bytearray()
    out += MAGIC
    out += struct.pack("<7I", VERSION, spot.head_dim, spot.bits, spot.n_layer_model, spot.n_head,
                       spot.n_head_kv, len(spot.layers))
    name = spot.model_name.encode("utf-8")
    out += struct.pack("<I", len(name)) + name
    out += struct.pack(f"<{len(spot.layers)}I", *spot.layers)
    for slot in range(len(spot.layers)):
        for mlp in list(spot.keys[slot]) + list(spot.queries[slot]):
            assert mlp.w1.shape == (spot.head_dim, spot.head_dim)
            assert mlp.w2.shape == (spot.bits, spot.head_dim)
            out += struct.pack("<f", float(mlp.in_scale))
            for a in (mlp.w1, mlp.b1, mlp.w2, mlp.b2):
                out += a.astype("<f4").tobytes()
    out += struct.pack("<I", zlib.crc32(bytes(out)) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(out)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8 + 4 or data[:8] != MAGIC:
        raise ValueError(f"{path}: not a spotlight hash file (bad magic)")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) & 0xFFFFFFFF != crc:
        raise ValueError(f"{path}: checksum mismatch")
    off = 8
    version, d, bits, n_layer_model, n_head, n_head_kv, n_layers = struct.unpack_from("<7I", data,
                                                                                      off)
    off += 28
    if version != VERSION:
        raise ValueError(f"{path}: version {version}, expected {VERSION}")
    (name_len,) = struct.unpack_from("<I", data, off)
    off += 4
    name = data[off:off + name_len].decode("utf-8")
    off += name_len
    layers = list(struct.unpack_from(f"<{n_layers}I", data, off))
    off += 4 * n_layers

    def take(count):
        nonlocal off
        a = np.frombuffer(data, dtype="<f4", count=count, offset=off).astype(np.float32)
        off += 4 * count
        return a

    keys, queries = [], []
    for _ in layers:
        mlps = []
        for _ in range(n_head_kv + n_head):
            s = take(1)[0]
            w1 = take(d * d).reshape(d, d)
            b1 = take(d)
            w2 = take(bits * d).reshape(bits, d)
            b2 = take(bits)
            mlps.append(Mlp(s, w1, b1, w2, b2))
        keys.append(mlps[:n_head_kv])
        queries.append(mlps[n_head_kv:])
    return SpotFile(d, bits, n_layer_model, n_head, n_head_kv, name, layers, keys, queries)


def outputs64(mlp, x):
    """z for rows x [n][d], in float64 (the reference the C++ forward is tested against)."""
    x = np.asarray(x, dtype=np.float64) * np.float64(mlp.in_scale)
    a = x @ mlp.w1.astype(np.float64).T + mlp.b1.astype(np.float64)
    h = x + a / (1.0 + np.exp(-a))
    return h @ mlp.w2.astype(np.float64).T + mlp.b2.astype(np.float64)


def pack(z):
    """Codes [n][bits / 16] uint16 from outputs z [n][bits] (bit i = z_i > 0)."""
    z = np.asarray(z)
    n, bits = z.shape
    b = (z > 0).astype(np.uint32).reshape(n, bits // 16, 16)
    return (b << np.arange(16, dtype=np.uint32)).sum(axis=2).astype(np.uint16)

