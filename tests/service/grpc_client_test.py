#!/usr/bin/env python3
"""Black-box test of magicpig_attn_node with an independent client: Python grpcio stubs generated
from proto/magicpig/v1/attention.proto (grpcio-tools, into a temporary directory), NumPy data.

    grpc_client_test.py PATH/TO/magicpig_attn_node SOURCE_DIR

Starts the node with mutual TLS (certificates from scripts/dev-certs) on 127.0.0.1:0 (reads the
port from its "listening on HOST:PORT" line), checks that clients without a certificate of its CA
are refused, creates sequences, appends KV in chunks, attends, and checks shapes, the full
estimator against a float64 softmax, that malformed requests get INVALID_ARGUMENT naming the
field, that a second certificate (another owner) cannot see or release the first one's sequences,
and that SIGTERM stops the node with exit code 0. Exit 77 (CTest SKIP) when grpcio / grpcio-tools /
numpy are missing.
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading

try:
    import grpc
    import numpy as np
    from grpc_tools import protoc
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (run scripts/python-env)")
    sys.exit(77)

FAILURES = []
CHECKS = [0]


def check(cond, what):
    CHECKS[0] += 1
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def pack_codes(codes, k):
    """Bit b of code i at bit position i*k + b, LSB-first in each byte (the proto's layout)."""
    codes = np.asarray(codes, dtype=np.uint32).reshape(-1)
    bits = ((codes[:, None] >> np.arange(k, dtype=np.uint32)[None, :]) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def generate_stubs(src, out):
    rc = protoc.main(["protoc", f"-I{src}/proto", f"--python_out={out}", f"--grpc_python_out={out}",
                      f"{src}/proto/magicpig/v1/attention.proto"])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed with {rc}")
    sys.path.insert(0, out)
    from magicpig.v1 import attention_pb2, attention_pb2_grpc  # noqa: E402
    return attention_pb2, attention_pb2_grpc


def make_pki(src, out):
    subprocess.run([f"{src}/scripts/dev-certs", out, "py"], check=True, stdout=subprocess.DEVNULL)
    return out


def credentials(pki, who):
    """mTLS credentials of `who` (compute, other, rogue), trusting the PKI's CA."""
    def read(name):
        with open(os.path.join(pki, name), "rb") as f:
            return f.read()
    return grpc.ssl_channel_credentials(root_certificates=read("ca.crt"),
                                        private_key=read(f"{who}.key"),
                                        certificate_chain=read(f"{who}.crt"))


def start_node(binary, pki):
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--memory-budget", "256M",
                             "--threads", "2", "--metrics-listen", "127.0.0.1:0",
                             "--tls-cert", f"{pki}/node.crt", "--tls-key", f"{pki}/node.key",
                             "--tls-ca", f"{pki}/ca.crt"],
                            stdout=subprocess.PIPE, text=True)
    line = [None]

    def read():
        line[0] = proc.stdout.readline()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(20)
    if not line[0] or not line[0].startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"node did not report its address: {line[0]!r}")
    return proc, line[0].split()[-1]


def softmax_reference(q, keys, values, scale):
    logits = scale * (keys.astype(np.float64) @ q.astype(np.float64))
    m = logits.max()
    w = np.exp(logits - m)
    z = w.sum()
    return (w / z) @ values.astype(np.float64), m + np.log(z)


def main():
    binary, src = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        pb, pb_grpc = generate_stubs(src, tmp)
        pki = make_pki(src, os.path.join(tmp, "pki"))
        proc, address = start_node(binary, pki)
        try:
            refuse_strangers(pb, pb_grpc, address, pki)
            run(pb, pb_grpc, address, pki)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
            check(rc == 0, f"node exit code after SIGTERM is 0 (got {rc})")
    print(f"{CHECKS[0] - len(FAILURES)} passed, {len(FAILURES)} failed")
    return 1 if FAILURES else 0


def refuse_strangers(pb, pb_grpc, address, pki):
    """Plaintext and a certificate of another CA get nowhere, not even NodeStatus."""
    for what, channel in (("plaintext", grpc.insecure_channel(address)),
                          ("rogue certificate", grpc.secure_channel(address,
                                                                    credentials(pki, "rogue")))):
        try:
            pb_grpc.AttentionServiceStub(channel).NodeStatus(pb.NodeStatusRequest(), timeout=5)
            check(False, f"{what}: NodeStatus answered")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE,
                  f"{what}: refused with UNAVAILABLE (got {e.code()})")
        channel.close()


def run(pb, pb_grpc, address, pki):
    channel = grpc.secure_channel(address, credentials(pki, "compute"))
    grpc.channel_ready_future(channel).result(timeout=10)
    stub = pb_grpc.AttentionServiceStub(channel)
    rng = np.random.default_rng(0)
    n_kv, group, d, k, l, layer = 2, 2, 32, 4, 8, 3
    heads = n_kv * group
    n = 150
    scale = 1.0 / np.sqrt(d)
    proj = rng.standard_normal((d, k * l)).astype(np.float32)

    def codes_of(x):  # [rows][d] -> [rows][L] SimHash codes
        bits = (x @ proj > 0).reshape(x.shape[0], l, k).astype(np.uint32)
        return (bits << np.arange(k, dtype=np.uint32)).sum(axis=2)

    keys = rng.standard_normal((n_kv, n, d)).astype(np.float32)
    keys -= keys.mean(axis=1, keepdims=True)
    values = rng.standard_normal((n_kv, n, d)).astype(np.float32)

    def chunk(seq, begin, count):
        kk = keys[:, begin:begin + count]
        return pb.KvChunk(sequence_id=seq, layer=layer, first_pos=begin, n_tokens=count,
                          keys=kk.tobytes(), values=values[:, begin:begin + count].tobytes(),
                          codes=pack_codes(codes_of(kk.reshape(-1, d)), k))

    def shape(estimator):
        return pb.ShardShape(layers=[1, layer], n_kv_heads=n_kv, group=group, head_dim=d, lsh_k=k,
                             lsh_l=l, dtype=pb.KV_DTYPE_F32, estimator=estimator)

    for seq, est in (("py-magicpig", pb.ESTIMATOR_MAGICPIG), ("py-full", pb.ESTIMATOR_FULL)):
        r = stub.CreateSequence(pb.CreateSequenceRequest(sequence_id=seq, shape=shape(est),
                                                         token_begin=0, max_tokens=1000))
        check(r.bytes_reserved > 0, f"{seq}: bytes_reserved > 0")
        resp = stub.AppendKV(iter([chunk(seq, 0, 64), chunk(seq, 64, 64), chunk(seq, 128, 22)]))
        check(resp.tokens == n, f"{seq}: AppendKV tokens == {n} (got {resp.tokens})")
    status = stub.NodeStatus(pb.NodeStatusRequest())
    check(status.sequences == 2, "NodeStatus.sequences == 2")
    check(0 < status.memory_used_bytes <= status.memory_budget_bytes, "memory used within budget")

    q = (rng.standard_normal((heads, d)) * 0.3 + 2.0 * keys[np.arange(heads) // group, 5]).astype(
        np.float32)
    query = lambda seq: pb.SequenceQuery(sequence_id=seq, q=q.tobytes(),
                                         codes=pack_codes(codes_of(q), k))
    requests = [pb.AttendRequest(step_id=7 + i, layer=layer, scale=scale,
                                 queries=[query("py-magicpig"), query("py-full")])
                for i in range(2)]
    responses = list(stub.Attend(iter(requests)))
    check(len(responses) == 2, "two Attend responses")
    for i, resp in enumerate(responses):
        check(resp.step_id == 7 + i, "step ids echoed in order")
        check(len(resp.partials) == 2, "one partial per query")
        for p in resp.partials:
            check(len(p.o) == heads * d * 4, f"{p.sequence_id}: o is [heads][d] float32")
            check(len(p.lse) == heads and len(p.n_touched) == heads, "lse, n_touched per head")
            check(p.n_keys == n, f"{p.sequence_id}: n_keys == {n}")
    magic, full = responses[0].partials
    check(all(0 <= t <= n for t in magic.n_touched) and sum(magic.n_touched) > 0,
          "magicpig sampled some keys")
    o = np.frombuffer(full.o, dtype=np.float32).reshape(heads, d)
    for h in range(heads):
        want_o, want_lse = softmax_reference(q[h], keys[h // group], values[h // group], scale)
        check(np.max(np.abs(o[h] - want_o)) < 1e-4, f"full o matches float64 softmax (head {h})")
        check(abs(full.lse[h] - want_lse) < 1e-4 * max(1, abs(want_lse)), f"full lse (head {h})")
        check(full.n_touched[h] == n, "full touches every key")

    def expect_error(call, code, field):
        try:
            call()
        except grpc.RpcError as e:
            check(e.code() == code and field in e.details(),
                  f"{field}: expected {code}, got {e.code()} '{e.details()}'")
            return
        check(False, f"{field}: expected {code}, got OK")

    bad_q = pb.SequenceQuery(sequence_id="py-full", q=q.tobytes()[:-4])
    expect_error(lambda: list(stub.Attend(iter([pb.AttendRequest(layer=layer, scale=scale,
                                                                 queries=[bad_q])]))),
                 grpc.StatusCode.INVALID_ARGUMENT, "queries[0].q")
    bad_shape = shape(pb.ESTIMATOR_FULL)
    bad_shape.head_dim = 100
    expect_error(lambda: stub.CreateSequence(pb.CreateSequenceRequest(
        sequence_id="bad", shape=bad_shape, max_tokens=10)), grpc.StatusCode.INVALID_ARGUMENT,
        "shape.head_dim")
    bad_chunk = chunk("py-full", 0, 4)
    bad_chunk.first_pos = n
    bad_chunk.codes = bad_chunk.codes[:-1]
    expect_error(lambda: stub.AppendKV(iter([bad_chunk])), grpc.StatusCode.INVALID_ARGUMENT,
                 "KvChunk.codes")
    expect_error(lambda: list(stub.Attend(iter([pb.AttendRequest(
        layer=layer, scale=scale, queries=[query("nobody")])]))), grpc.StatusCode.NOT_FOUND,
        "nobody")

    # Another certificate of the same CA is another owner: the sequences do not exist for it.
    other_channel = grpc.secure_channel(address, credentials(pki, "other"))
    other = pb_grpc.AttentionServiceStub(other_channel)
    check(other.NodeStatus(pb.NodeStatusRequest()).sequences == 2, "other owner connects")
    expect_error(lambda: list(other.Attend(iter([pb.AttendRequest(
        layer=layer, scale=scale, queries=[query("py-full")])]))), grpc.StatusCode.NOT_FOUND,
        "py-full")
    expect_error(lambda: other.ReleaseSequence(pb.ReleaseSequenceRequest(sequence_id="py-full")),
                 grpc.StatusCode.NOT_FOUND, "py-full")
    expect_error(lambda: other.AppendKV(iter([chunk("py-full", n, 4)])),
                 grpc.StatusCode.NOT_FOUND, "py-full")
    other_channel.close()

    for seq in ("py-magicpig", "py-full"):
        check(stub.ReleaseSequence(pb.ReleaseSequenceRequest(sequence_id=seq)).bytes_freed > 0,
              f"{seq}: released")
    status = stub.NodeStatus(pb.NodeStatusRequest())
    check(status.sequences == 0 and status.memory_used_bytes == 0, "nothing held after release")
    channel.close()


if __name__ == "__main__":
    sys.exit(main())
