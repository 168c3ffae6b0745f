#!/usr/bin/env python3
"""Independent float64 reference forward pass of a llama/qwen2 GGUF model, in NumPy.

Reads the file with the PyPI `gguf` package (its own parser and dequantisers, not magicpig's),
dequantises every weight to float64 and runs the textbook transformer: RMSNorm, RoPE (adjacent
pairs for llama GGUFs, half-offset for qwen2), grouped-query causal softmax attention, SwiGLU MLP,
tied or separate LM head, with a plain per-layer K/V cache for incremental decoding.

`quantize_activations=True` additionally rounds the input of every product with an integer-
quantised weight to 8 bits per block (d = max|x|/127, q = round(x/d); blocks of 32 values for the
32-value weight types, of 256 for the K-quants, whose kernels use one activation scale per super-
block as llama.cpp's Q8_K does), the documented arithmetic of magicpig's (and llama.cpp's) CPU
kernels, so that kernel bugs are not hidden behind that rounding noise.

Matrices are kept as the float32 arrays the `gguf` dequantisers return (exactly their values, half
the memory of float64: a 1.5B model takes ~7 GB) and promoted to float64 in every product; vectors
and activations are float64 throughout. `fp16_kv=True` stores K (after RoPE) and V rounded to
IEEE fp16, as magicpig's KV cache does. Everything else stays float64.
"""
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize

_INTEGER_TYPES = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0}
_K_TYPES = {QT.Q4_K, QT.Q5_K, QT.Q6_K}


def quantize_blocks(x, block=32):
    """Rounds the last axis of x to int8 per block of `block` values, returns the dequantised
    values."""
    shape = x.shape
    b = x.reshape(-1, block)
    d = (np.abs(b).max(axis=1, keepdims=True) / 127.0).astype(np.float32).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.clip(np.rint(b / d), -127, 127), 0.0)
    return (q * d).reshape(shape)


class Reference:
    def __init__(self, path, quantize_activations=False, fp16_kv=False):
        r = GGUFReader(path)
        fields = {k: f.contents() for k, f in r.fields.items()
                  if not k.startswith("tokenizer.ggml.")}
        arch = fields["general.architecture"]
        self.arch = arch
        f = lambda k, d=None: fields.get(f"{arch}.{k}", d)
        self.n_layer = int(f("block_count"))
        self.n_embd = int(f("embedding_length"))
        self.n_head = int(f("attention.head_count"))
        self.n_head_kv = int(f("attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(f("rope.dimension_count", self.head_dim))
        self.base = float(f("rope.freq_base", 10000.0))
        self.eps = float(f("attention.layer_norm_rms_epsilon", 1e-5))
        self.quantize_activations = quantize_activations
        self.fp16_kv = fp16_kv
        self.w, self.act_block = {}, {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type)
            if len(t.shape) == 1:
                a = a.astype(np.float64)
            # gguf-py returns numpy shape = reversed dims: [out, in] for matrices.
            self.w[t.name] = a.reshape([int(d) for d in reversed(t.shape)])
            if t.tensor_type in _INTEGER_TYPES:
                self.act_block[t.name] = 32
            elif t.tensor_type in _K_TYPES:
                self.act_block[t.name] = 256
        self.out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        self.reset()

    def reset(self):
        self.k_cache = [np.zeros((0, self.n_head_kv, self.head_dim)) for _ in range(self.n_layer)]
        self.v_cache = [np.zeros((0, self.n_head_kv, self.head_dim)) for _ in range(self.n_layer)]

    def linear(self, x, name):
        if self.quantize_activations and name in self.act_block:
            x = quantize_blocks(x, self.act_block[name])
        return x @ self.w[name].T.astype(np.float64)

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        half = self.n_rot // 2
        inv = self.base ** (-2.0 * np.arange(half) / self.n_rot)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.copy()
        if self.arch == "llama":
            a, b = x[..., 0:self.n_rot:2].copy(), x[..., 1:self.n_rot:2].copy()
            x[..., 0:self.n_rot:2] = a * c - b * s
            x[..., 1:self.n_rot:2] = a * s + b * c
        else:
            a, b = x[..., :half].copy(), x[..., half:self.n_rot].copy()
            x[..., :half] = a * c - b * s
            x[..., half:self.n_rot] = a * s + b * c
        return x

    def forward(self, ids, all_logits=False):
        """Appends ids to the cached sequence; returns logits of the new positions (or the last)."""
        n = len(ids)
        start = self.k_cache[0].shape[0]
        x = self.w["token_embd.weight"][np.array(ids)].astype(np.float64)
        pos = np.arange(start, start + n, dtype=np.float64)
        total = start + n
        mask = np.triu(np.full((n, total), -np.inf), start + 1)
        g = self.n_head // self.n_head_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.rms(x, self.w[p + "attn_norm.weight"])
            q = self.linear(h, p + "attn_q.weight")
            k = self.linear(h, p + "attn_k.weight")
            v = self.linear(h, p + "attn_v.weight")
            if p + "attn_q.bias" in self.w:
                q += self.w[p + "attn_q.bias"]
                k += self.w[p + "attn_k.bias"]
                v += self.w[p + "attn_v.bias"]
            q = self.rope(q.reshape(n, self.n_head, self.head_dim), pos)
            k = self.rope(k.reshape(n, self.n_head_kv, self.head_dim), pos)
            if self.fp16_kv:
                k = k.astype(np.float16).astype(np.float64)
                v = v.astype(np.float16).astype(np.float64)
            self.k_cache[l] = np.concatenate([self.k_cache[l], k])
            self.v_cache[l] = np.concatenate(
                [self.v_cache[l], v.reshape(n, self.n_head_kv, self.head_dim)])
            K, V = self.k_cache[l], self.v_cache[l]
            out = np.empty((n, self.n_head, self.head_dim))
            for hh in range(self.n_head):
                s = q[:, hh, :] @ K[:, hh // g, :].T / np.sqrt(self.head_dim) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hh, :] = s @ V[:, hh // g, :]
            x = x + self.linear(out.reshape(n, -1), p + "attn_output.weight")
            h = self.rms(x, self.w[p + "ffn_norm.weight"])
            gate = self.linear(h, p + "ffn_gate.weight")
            up = self.linear(h, p + "ffn_up.weight")
            x = x + self.linear(gate / (1 + np.exp(-gate)) * up, p + "ffn_down.weight")
        x = self.rms(x if all_logits else x[-1:], self.w["output_norm.weight"])
        return self.linear(x, self.out_name)

    def greedy(self, ids, n):
        """Greedy continuation of n tokens after ids (resets the cache first)."""
        self.reset()
        logits = self.forward(ids)
        out = []
        for _ in range(n):
            tok = int(logits[-1].argmax())
            out.append(tok)
            logits = self.forward([tok])
        return out
