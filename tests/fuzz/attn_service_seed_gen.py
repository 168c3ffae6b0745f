#!/usr/bin/env python3
"""Writes the seed scripts of tests/fuzz/attn_service_fuzzer.cc into tests/fuzz/corpus/attn_service:
valid sessions (create, append in chunks, commit, attend, release) for each estimator and both
owners, plus a stranger's calls on another owner's sequence and a stale-incarnation drop.

    .venv/bin/python tests/fuzz/attn_service_seed_gen.py SOURCE_DIR

Needs grpcio-tools and numpy (scripts/python-env); deterministic (fixed seeds).
"""
import os
import struct
import sys
import tempfile

import numpy as np
from grpc_tools import protoc


def stubs(src, out):
    if protoc.main(["protoc", f"-I{src}/proto", f"--python_out={out}",
                    f"{src}/proto/magicpig/v1/attention.proto"]) != 0:
        raise RuntimeError("protoc failed")
    sys.path.insert(0, out)
    from magicpig.v1 import attention_pb2
    return attention_pb2


def pack_codes(codes, k):
    codes = np.asarray(codes, dtype=np.uint32).reshape(-1)
    bits = ((codes[:, None] >> np.arange(k, dtype=np.uint32)[None, :]) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def op(code, owner, message):
    data = message.SerializeToString() if message is not None else b""
    return struct.pack("<BH", code + 8 * owner, len(data)) + data


def session(pb, rng, estimator, owner, n_kv=1, group=2, d=16, k=3, l=4, n=24, commit=True):
    seq = f"s{estimator}"
    shape = pb.ShardShape(layers=[0], n_kv_heads=n_kv, group=group, head_dim=d, lsh_k=k, lsh_l=l,
                          dtype=pb.KV_DTYPE_F32, estimator=estimator, budget=4, va_epsilon=0.2,
                          va_delta=0.1, va_base_rate=0.05, spotlight_fraction=0.2)
    out = op(0, owner, pb.CreateSequenceRequest(sequence_id=seq, shape=shape, max_tokens=64))
    keys = rng.standard_normal((n_kv, n, d)).astype(np.float32)
    values = rng.standard_normal((n_kv, n, d)).astype(np.float32)
    codes = rng.integers(0, 1 << k, size=(n_kv * n, l))
    for begin in (0, n // 2):
        count = n // 2
        chunk_codes = codes.reshape(n_kv, n, l)[:, begin:begin + count].reshape(-1)
        out += op(1, owner, pb.KvChunk(sequence_id=seq, layer=0, first_pos=begin, n_tokens=count,
                                       keys=keys[:, begin:begin + count].tobytes(),
                                       values=values[:, begin:begin + count].tobytes(),
                                       codes=pack_codes(chunk_codes, k)))
    if not commit:
        return out, seq
    out += op(2, owner, None)
    q = rng.standard_normal((n_kv * group, d)).astype(np.float32)
    query = pb.SequenceQuery(sequence_id=seq, q=q.tobytes(),
                             codes=pack_codes(rng.integers(0, 1 << k, size=n_kv * group * l), k))
    out += op(3, owner, pb.AttendRequest(step_id=1, layer=0, scale=0.25, queries=[query]))
    return out, seq


def main():
    src = sys.argv[1]
    dest = os.path.join(src, "tests/fuzz/corpus/attn_service")
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pb = stubs(src, tmp)
        rng = np.random.default_rng(1)
        seeds = {}
        for est, name in ((pb.ESTIMATOR_MAGICPIG, "magicpig"), (pb.ESTIMATOR_FULL, "full"),
                          (pb.ESTIMATOR_TOPK, "topk"), (pb.ESTIMATOR_ORACLE, "oracle"),
                          (pb.ESTIMATOR_VATTENTION, "vattention"),
                          (pb.ESTIMATOR_VATTENTION_LSH, "vattention-lsh")):
            script, seq = session(pb, rng, est, owner=est % 2)
            seeds[f"session-{name}"] = script + op(4, est % 2,
                                                   pb.ReleaseSequenceRequest(sequence_id=seq))
        script, seq = session(pb, rng, pb.ESTIMATOR_FULL, owner=0)
        # The other owner tries the sequence, then the owner drops its stale runs and expires.
        seeds["stranger"] = (script + op(4, 1, pb.ReleaseSequenceRequest(sequence_id=seq)) +
                             op(3, 1, pb.AttendRequest(layer=0, scale=0.25, queries=[
                                 pb.SequenceQuery(sequence_id=seq)])) +
                             op(5, 0, pb.ReleaseStaleRequest(instance="pod-a", incarnation="2")) +
                             op(6, 0, None))
        script, _ = session(pb, rng, pb.ESTIMATOR_MAGICPIG, owner=1, commit=False)
        seeds["staged-then-dropped"] = script + op(7, 1, None)
        # Spotlight's learned codes: 16-bit words, 4 per key (64 bits), codes-only shards. Its
        # own generator, so the seeds above stay as they were.
        script, seq = session(pb, np.random.default_rng(2), pb.ESTIMATOR_SPOTLIGHT, owner=1, k=16)
        seeds["session-spotlight"] = script + op(4, 1, pb.ReleaseSequenceRequest(sequence_id=seq))
        for name, data in seeds.items():
            with open(os.path.join(dest, name), "wb") as f:
                f.write(data)
        print(f"wrote {len(seeds)} seeds to {dest}")


if __name__ == "__main__":
    main()
