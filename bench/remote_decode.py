"""Decode throughput with the attention in process vs on 1 and 2 attention nodes (loopback).

For each depth and configuration it starts the nodes and a magicpig_gpu_node, sends `batch`
concurrent streaming completions of a prompt of about `depth` tokens, and reports per request the
time to first token and the decode rate (tokens after the first / time from the first to the
last), the aggregate decode rate, and, from the compute node's /metrics, the decode-step
breakdown (dense / attention / sampling seconds per step) and the attention RPC bytes per sparse
layer step (up and down), Attend messages per decode step and their mean round trip, and the CPU
time per decode step of the compute node and of the attention nodes (from /proc), counted from the
moment every request has its first token and 0.3 s more (so the prefill's AppendKV uploads are not
included). A measurement; nothing is asserted. Results go to stdout as a table.

With --rounds N every configuration runs N times, interleaved (embedded, 1 node, 2 nodes, then
again), and a last table gives each remote configuration's rate over the embedded rate of the
same round and the median of those ratios: on a small shared machine single runs scatter widely.

usage: remote_decode.py GPU_NODE ATTN_NODE MODEL [--depths 1024,4096] [--batches 1,4]
                        [--max-tokens 32] [--threads 2] [--ping-pong on|off|auto|both]
                        [--coalesce on|off|both] [--placement pack|spread] [--rounds 1] [--pin]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

TEXT = ("The harbour master kept a ledger of every ship that came and went, noting the cargo, the "
        "crew, the weather and the hour of arrival. ")


def pinned_to(cores):
    """A preexec_fn that keeps the child on `cores` (None: no pinning)."""
    if cores is None:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def core_plan(a, n_nodes):
    """The compute node's (or the embedded run's) thread count, and with --pin its cores and each
    node's: the compute node on the first cores, node i on the next --node-threads cores each."""
    threads_here = a.remote_threads if n_nodes and a.remote_threads else a.threads
    if not a.pin:
        return threads_here, None, [None] * n_nodes
    firsts = [threads_here + i * a.node_threads for i in range(n_nodes)]
    return (threads_here, set(range(threads_here)),
            [set(range(f, f + a.node_threads)) for f in firsts])


def start_node(node, threads, cores=None):
    p = subprocess.Popen([node, "--listen", "127.0.0.1:0", "--metrics-listen", "off",
                          "--memory-budget", "4G", "--threads", str(threads), "--insecure"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         preexec_fn=pinned_to(cores))
    m = re.match(r"listening on (.+)", p.stdout.readline().strip())
    assert m, "attention node did not start"
    return p, m.group(1)


def cpu_seconds(pid):
    """User + system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(gpu, model, threads, nodes, batch, ping_pong, coalesce, placement, cores=None):
    args = [gpu, "--model", model, "--listen", "127.0.0.1:0", "--threads", str(threads),
            "--max-batch", str(batch), "--ping-pong", ping_pong, "--coalesce-attend", coalesce,
            # Measure the sampled path (and the nodes) at every depth, 1K included.
            "--sparse-min-keys", "1"]
    if nodes:
        args += ["--attention-nodes", ",".join(nodes), "--placement", placement, "--insecure"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         preexec_fn=pinned_to(cores))
    m = re.match(r"listening on .+:(\d+)", p.stdout.readline())
    assert m, "compute node did not start"
    return p, int(m.group(1))


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, v = line.rsplit(" ", 1)
        out[name] = float(v)
    return out


def total(m, prefix):
    return sum(v for k, v in m.items() if k == prefix or k.startswith(prefix + "{"))


def tokenize(port, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/tokenize", json.dumps({"prompt": text}))
    return json.loads(c.getresponse().read())["tokens"]


def one_request(port, prompt_ids, max_tokens, out, first_token):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    body = json.dumps({"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True})
    t0 = time.time()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        first_token.release()  # do not leave the decode-phase window waiting
        raise RuntimeError("request failed: HTTP %d %s" % (r.status, r.read()[:300]))
    first = last = None
    n = 0
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev == b"data: [DONE]":
                continue
            d = json.loads(ev[6:])
            if d["choices"] and d["choices"][0].get("finish_reason") is None:
                now = time.time()
                if first is None:
                    first_token.release()
                first = first or now
                last = now
                n += 1
    out.append((first - t0, (n - 1) / (last - first) if n > 1 and last > first else 0.0, n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpu")
    ap.add_argument("attn")
    ap.add_argument("model")
    ap.add_argument("--depths", default="1024,4096")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--configs", default="0,1,2", help="attention nodes per run; 0 = embedded")
    ap.add_argument("--ping-pong", default="auto",
                    help="remote runs: on, off, auto, a comma list of those, or both (= off,on)")
    ap.add_argument("--coalesce", default="on",
                    help="on, off or both: one Attend message per node and micro-batch (remote)")
    ap.add_argument("--placement", default="pack", help="pack or spread (remote runs)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="compute node threads, embedded runs")
    ap.add_argument("--remote-threads", type=int, default=0,
                    help="compute node threads with attention nodes (0: --threads)")
    ap.add_argument("--node-threads", type=int, default=1, help="threads per attention node")
    ap.add_argument("--sparse-layers", type=int, default=28, help="SmolLM2-135M: 30 - {0, 15}")
    ap.add_argument("--context", type=int, default=8192, help="the model's context length")
    ap.add_argument("--pin", action="store_true",
                    help="disjoint cores per process, as if each node had its own host: the "
                         "compute node (or the embedded run) on the first --threads cores, node i "
                         "on the next --node-threads cores each")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every configuration this many times, interleaved, and end with "
                         "the median ratio of each remote configuration to embedded")
    a = ap.parse_args()
    if a.pin:
        plans = [core_plan(a, int(c)) for c in a.configs.split(",")]
        need = max(len(set.union(here, *nodes)) for _, here, nodes in plans)
        if need > len(os.sched_getaffinity(0)):
            ap.error("--pin needs %d cores, this process may use %d" % (
                need, len(os.sched_getaffinity(0))))
    print("| depth | nodes | ping-pong | coalesce | batch | TTFT s | decode tok/s per seq | "
          "aggregate tok/s | dense / attention / sampling ms per step | RPC KiB up / down per "
          "sparse layer step | Attend messages per step | Attend RTT ms | CPU ms per step: "
          "compute / nodes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summaries = []
    for depth in [int(d) for d in a.depths.split(",")]:
        for batch in [int(b) for b in a.batches.split(",")]:
            runs = []
            for n_nodes in [int(c) for c in a.configs.split(",")]:
                modes = ["off"] if n_nodes == 0 else (
                    ["off", "on"] if a.ping_pong == "both" else a.ping_pong.split(","))
                coalesce = ["on"] if n_nodes == 0 else (
                    ["off", "on"] if a.coalesce == "both" else [a.coalesce])
                runs += [(n_nodes, m, c) for m in modes for c in coalesce]
            rates = {}  # (n_nodes, ping_pong, coalesce) -> aggregate tok/s per round
            for _ in range(a.rounds):
                for run in runs:
                    rates.setdefault(run, []).append(one_run(a, depth, batch, *run))
            summaries += ratio_rows(depth, batch, rates)
    if a.rounds > 1 and summaries:
        print("\n| depth | batch | nodes | ping-pong | coalesce | embedded tok/s per round | "
              "remote tok/s per round | of embedded, per round | median |")
        print("|---|---|---|---|---|---|---|---|---|")
        print("\n".join(summaries))
    return 0


def ratio_rows(depth, batch, rates):
    """Per remote configuration: its aggregate rate over the embedded rate of the same round (a
    round's runs follow each other, so they share the machine's state of that moment)."""
    embedded = next((agg for (n_nodes, _, _), agg in rates.items() if n_nodes == 0), None)
    if not embedded:
        return []
    rows = []
    for (n_nodes, ping_pong, coalesce), agg in rates.items():
        if n_nodes == 0:
            continue
        ratios = [r / e if e else 0.0 for r, e in zip(agg, embedded)]
        rows.append("| %d | %d | %d | %s | %s | %s | %s | %s | **%.1f%%** |" % (
            depth, batch, n_nodes, ping_pong, coalesce,
            " / ".join("%.1f" % e for e in embedded), " / ".join("%.1f" % r for r in agg),
            " / ".join("%.1f%%" % (100 * x) for x in ratios), 100 * statistics.median(ratios)))
    return rows


def one_run(a, depth, batch, n_nodes, ping_pong, coalesce):
    """One configuration: prints its table row and returns its aggregate tok/s (0 on failure)."""
    procs, nodes = [], []
    try:
        threads_here, cores_here, node_cores = core_plan(a, n_nodes)
        for cores in node_cores:
            p, addr = start_node(a.attn, a.node_threads, cores)
            procs.append(p)
            nodes.append(addr)
        server, port = start_server(a.gpu, a.model, threads_here, nodes, batch,
                                    ping_pong, coalesce, a.placement, cores_here)
        procs.append(server)
        unit = tokenize(port, TEXT)
        # prompt + max_tokens must fit the model's context (8192 for SmolLM2): a depth
        # at the context length is taken as the longest prompt that fits.
        length = min(depth, a.context - a.max_tokens) - 8
        base = (unit * (length // len(unit) + 1))[:length]
        prompts = [base + tokenize(port, " Entry %d:" % i) for i in range(batch)]
        results = []
        first_token = threading.Semaphore(0)
        threads = [threading.Thread(target=one_request,
                                    args=(port, p, a.max_tokens, results, first_token))
                   for p in prompts]
        for t in threads:
            t.start()
        # The decode-phase counters start once every request has its first token
        # (all prefills and their AppendKV uploads are done then).
        for _ in threads:
            first_token.acquire()
        # Appends are asynchronous: the last layer's rows may still be on their way
        # when the first token is out. A short pause lets them land (the step and
        # token counters are read in the same window, so rates stay consistent).
        time.sleep(0.3)
        before = metrics(port)
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        for t in threads:
            t.join()
        after = metrics(port)
        cpu = [cpu_seconds(p.pid) - c for p, c in zip(procs, cpu_before)]
        if len(results) != len(prompts):
            print("| %d | %s | %s | %s | %d | %d of %d requests failed |" % (
                depth, n_nodes or "embedded", "-" if not n_nodes else ping_pong,
                "-" if not n_nodes else coalesce, batch,
                len(prompts) - len(results), len(prompts)), flush=True)
            return 0.0
        d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        steps = max(1.0, d.get("magicpig_batch_size_count", 0))
        phase = [1000 * d.get('magicpig_decode_phase_seconds_total{phase="%s"}' % p, 0)
                 / steps for p in ("dense", "attention", "sampling")]
        rtt_n = total(d, "magicpig_attn_rpc_latency_seconds_count")
        rtt = 1000 * total(d, "magicpig_attn_rpc_latency_seconds_sum") / rtt_n \
            if rtt_n else 0
        # Decode steps (tokens after each request's first, which prefill gives) times
        # the sparse layers: the per-layer exchanges with the attention side.
        decode_tokens = d.get("magicpig_generation_tokens_total", 0)
        sparse_steps = decode_tokens * a.sparse_layers if n_nodes else 0
        up = sum(v for k, v in d.items() if k.startswith(
            "magicpig_attn_rpc_bytes_total") and 'direction="up"' in k)
        down = sum(v for k, v in d.items() if k.startswith(
            "magicpig_attn_rpc_bytes_total") and 'direction="down"' in k)
        per = lambda b: b / 1024 / sparse_steps if sparse_steps else 0  # noqa: E731
        split_steps = d.get('magicpig_decode_micro_batch_steps_total{micro_batches="2"}', 0)
        one_steps = d.get('magicpig_decode_micro_batch_steps_total{micro_batches="1"}', 0)
        mode = "-" if not n_nodes else ping_pong
        if n_nodes and ping_pong == "auto" and split_steps + one_steps:
            mode += " (%d%% split)" % round(100 * split_steps / (split_steps + one_steps))
        ttft = sum(r[0] for r in results) / len(results)
        rate = sum(r[1] for r in results) / len(results)
        agg = rate * len(results)
        # procs: the nodes first, the compute node last.
        cpu_ms = lambda s: 1000 * s / steps  # noqa: E731
        print("| %d | %s | %s | %s | %d | %.2f | %.1f | %.1f | %.1f / %.1f / %.1f | "
              "%.1f / %.1f | %.1f | %.2f | %.1f / %.1f |" % (
                  depth, n_nodes or "embedded", mode,
                  "-" if not n_nodes else coalesce, batch, ttft, rate, agg, *phase,
                  per(up), per(down), rtt_n / steps, rtt, cpu_ms(cpu[-1]),
                  cpu_ms(sum(cpu[:-1]))), flush=True)
        return agg
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)


if __name__ == "__main__":
    sys.exit(main())
