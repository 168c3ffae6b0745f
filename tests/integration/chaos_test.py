#!/usr/bin/env python3
"""Chaos test of the node fabric (issue #36): a compute node with three attention nodes (mutual
TLS, certificates from scripts/dev-certs) serves concurrent streaming completions while nodes are
killed with SIGKILL and restarted on their port, or frozen with SIGSTOP and thawed with SIGCONT,
at random times.

    chaos_test.py GPU_NODE ATTN_NODE MODEL EXAMPLE_TEXT SOURCE_DIR
                  [--duration 90] [--clients 8] [--seed 1] [--rss-every 0] [--rss-csv FILE]

Every request must either complete with exactly the text the embedded compute node (no attention
nodes, same flags) gives for its prompt, or fail cleanly: an HTTP error with a JSON error body, or
an SSE error event. Anything else fails the test: a different text, a malformed or truncated
stream, a request that hangs past its timeout. Afterwards (chaos stopped, every node up) every
node must report, within its lease time, 0 sequences and 0 bytes in use.

With --rss-every S it samples the resident memory of every process every S seconds (the soak in
docs/deploy.md) and prints the first and last samples; --rss-csv writes them all. All processes
run with MAGICPIG_SIMD=avx2, whose kernels give a sequence the same tokens batched or alone, so
batching under chaos cannot change a text.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ENV = dict(os.environ, MAGICPIG_SIMD="avx2")
COMPUTE_FLAGS = ["--threads", "2", "--max-batch", "8", "--max-queue", "64", "--shard-block",
                 "256", "--placement", "spread", "--attend-timeout-ms", "1500",
                 "--log-level", "warning",
                 # The prompts are a few hundred tokens: offload them (and so use the nodes) anyway.
                 "--sparse-min-keys", "1"]
MAX_TOKENS = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_line(proc, pattern, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        m = re.search(pattern, line or "")
        if m:
            return m
        if not line and proc.poll() is not None:
            break
    raise RuntimeError(f"process {proc.args[0]} did not print {pattern!r}")


class AttnNode:
    def __init__(self, binary, pki):
        self.binary, self.pki = binary, pki
        self.port, self.metrics_port = free_port(), free_port()
        self.proc = None
        self.stopped = False

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "--listen", f"127.0.0.1:{self.port}", "--metrics-listen",
             f"127.0.0.1:{self.metrics_port}", "--memory-budget", "2G", "--threads", "1",
             "--sequence-ttl", "20", "--log-level", "error",
             "--tls-cert", f"{self.pki}/node.crt", "--tls-key", f"{self.pki}/node.key",
             "--tls-ca", f"{self.pki}/ca.crt"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
        wait_line(self.proc, r"listening on", 30)
        self.stopped = False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def metrics(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        out = {}
        for line in text.splitlines():
            if line.startswith("magicpig_attn_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def start_compute(binary, model, extra, log=None):
    proc = subprocess.Popen([binary, "--model", model, "--listen", "127.0.0.1:0"] +
                            COMPUTE_FLAGS + extra, stdout=subprocess.PIPE,
                            stderr=log or subprocess.DEVNULL, text=True, env=ENV)
    m = wait_line(proc, r"listening on \S+:(\d+)", 120)
    return proc, int(m.group(1))


def complete(port, prompt, timeout):
    """('ok', text) | ('error', what) for a clean failure | ('bad', what)."""
    body = json.dumps({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode()
        conn.close()
    except (OSError, http.client.HTTPException) as e:
        return "bad", f"transport: {e!r}"
    if resp.status != 200:
        try:
            err = json.loads(data)["error"]["message"]
            return "error", f"{resp.status}: {err}"
        except (ValueError, KeyError, TypeError):
            return "bad", f"{resp.status} without a JSON error body: {data[:200]!r}"
    events = [e for e in data.split("\n\n") if e]
    if not events or not all(e.startswith("data: ") for e in events):
        return "bad", f"malformed stream: {data[:200]!r}"
    payloads = [e[6:] for e in events]
    text = []
    for p in payloads[:-1]:
        doc = json.loads(p)
        if "error" in doc:
            return "error", f"stream error: {doc['error'].get('message')}"
        for c in doc.get("choices") or []:
            text.append(c.get("text") or "")
    if payloads[-1] != "[DONE]":
        try:
            doc = json.loads(payloads[-1])
            if "error" in doc:
                return "error", f"stream error: {doc['error'].get('message')}"
        except ValueError:
            pass
        return "bad", f"stream does not end with [DONE]: {data[-200:]!r}"
    return "ok", "".join(text)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpu_node")
    ap.add_argument("attn_node")
    ap.add_argument("model")
    ap.add_argument("example")
    ap.add_argument("source_dir")
    ap.add_argument("--duration", type=float, default=90)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-every", type=float, default=0)
    ap.add_argument("--rss-csv", default="")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.example) as f:
        fact = f.read()
    prompts = [fact[i * 700:i * 700 + 1400 + 300 * i] + "\n\nQuestion: what is this about?"
               for i in range(args.clients)]
    failures = []

    # The reference: the embedded compute node, one prompt at a time.
    proc, port = start_compute(args.gpu_node, args.model, [])
    try:
        want = []
        for p in prompts:
            kind, text = complete(port, p, 300)
            if kind != "ok":
                raise RuntimeError(f"embedded reference failed: {text}")
            want.append(text)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"reference: {len(want)} texts of {MAX_TOKENS} tokens from the embedded node")

    tmp = tempfile.mkdtemp(prefix="magicpig-chaos-")
    pki = os.path.join(tmp, "pki")
    subprocess.run([os.path.join(args.source_dir, "scripts/dev-certs"), pki, "chaos"],
                   check=True, stdout=subprocess.DEVNULL)
    nodes = [AttnNode(args.attn_node, pki) for _ in range(3)]
    for n in nodes:
        n.start()
    addresses = ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    compute_log_path = os.path.join(tmp, "compute.log")
    compute_log = open(compute_log_path, "w")
    compute, port = start_compute(args.gpu_node, args.model, [
        "--attention-nodes", addresses, "--tls-cert", f"{pki}/compute.crt",
        "--tls-key", f"{pki}/compute.key", "--tls-ca", f"{pki}/ca.crt"], compute_log)
    stop = threading.Event()
    lock = threading.Lock()
    counts = {"ok": 0, "error": 0}
    events = []

    def client(i):
        while not stop.is_set():
            kind, text = complete(port, prompts[i], 240)
            with lock:
                if kind == "ok" and text != want[i]:
                    failures.append(f"client {i}: text differs from the embedded run:\n"
                                    f"  got  {text!r}\n  want {want[i]!r}")
                elif kind == "bad":
                    failures.append(f"client {i}: {text}")
                else:
                    counts[kind] += 1
                    if kind == "error" and counts["error"] <= 5:
                        print(f"  clean failure: {text[:160]}")

    def chaos():
        while not stop.wait(rng.uniform(1.0, 4.0)):
            live = [n for n in nodes if n.alive() and not n.stopped]
            if len(live) < 2:
                continue  # keep one node serving: losing all is the clean-failure case below
            n = rng.choice(live)
            if rng.random() < 0.5:
                n.proc.send_signal(signal.SIGKILL)
                n.proc.wait()
                events.append(f"{time.strftime('%X')} kill -9 node :{n.port}")
                if stop.wait(rng.uniform(1.0, 3.0)):
                    break
                n.start()
                events.append(f"{time.strftime('%X')} restart node :{n.port}")
            else:
                n.proc.send_signal(signal.SIGSTOP)
                n.stopped = True
                events.append(f"{time.strftime('%X')} SIGSTOP node :{n.port}")
                stop.wait(rng.uniform(1.0, 4.0))
                n.proc.send_signal(signal.SIGCONT)
                n.stopped = False
                events.append(f"{time.strftime('%X')} SIGCONT node :{n.port}")

    rss_rows = []

    def sample_rss():
        t0 = time.time()
        while not stop.wait(args.rss_every):
            row = [round(time.time() - t0), rss_kib(compute.pid)] + [rss_kib(n.proc.pid)
                                                                       for n in nodes]
            rss_rows.append(row)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=chaos))
    if args.rss_every > 0:
        threads.append(threading.Thread(target=sample_rss))
    for t in threads:
        t.start()
    time.sleep(args.duration)
    stop.set()
    for t in threads:
        t.join(timeout=300)
        if t.is_alive():
            failures.append("a client hung past its timeout")
    for n in nodes:
        if n.stopped:
            n.proc.send_signal(signal.SIGCONT)
            n.stopped = False
        if not n.alive():
            n.start()
    print(f"chaos: {len(events)} events; requests: {counts['ok']} completed with the embedded "
          f"text, {counts['error']} failed cleanly")
    for e in events[:12]:
        print("  " + e)
    if counts["ok"] == 0:
        failures.append("no request completed")

    # Afterwards: every node empties within its lease (20 s) plus the reaper's period.
    compute.terminate()
    try:
        compute.wait(timeout=120)
    except subprocess.TimeoutExpired:
        failures.append("the compute node did not stop within 120 s of SIGTERM")
        subprocess.run(["gdb", "-p", str(compute.pid), "-batch", "-ex", "thread apply all bt"],
                       stdout=open(os.path.join(tmp, "compute-stacks.txt"), "w"),
                       stderr=subprocess.DEVNULL)
        print(f"stacks in {tmp}/compute-stacks.txt")
        compute.kill()
        compute.wait()
    deadline = time.time() + 45
    held = None
    while time.time() < deadline:
        held = [(n.port, m.get("magicpig_attn_sequences"), m.get("magicpig_attn_kv_bytes"),
                 m.get("magicpig_attn_hash_table_bytes"), m.get("magicpig_attn_memory_usage_ratio"))
                for n in nodes for m in [n.metrics()]]
        if all(h[1] == 0 and h[2] == 0 and h[3] == 0 and h[4] == 0 for h in held):
            break
        time.sleep(1)
    print("nodes afterwards (port, sequences, kv bytes, table bytes, usage ratio): " + str(held))
    if not all(h[1] == 0 and h[2] == 0 and h[3] == 0 and h[4] == 0 for h in held):
        failures.append(f"nodes still hold memory after the run: {held}")
    for n in nodes:
        n.proc.terminate()
        n.proc.wait(timeout=60)

    if rss_rows:
        print("rss KiB (seconds, compute, node1, node2, node3): first "
              f"{rss_rows[:3]}, last {rss_rows[-3:]}")
        if args.rss_csv:
            with open(args.rss_csv, "w") as f:
                f.write("seconds,compute_kib,node1_kib,node2_kib,node3_kib\n")
                for r in rss_rows:
                    f.write(",".join(map(str, r)) + "\n")
    compute_log.close()
    with open(compute_log_path) as f:
        warnings = [line.rstrip() for line in f if " W " in line or " E " in line]
    print(f"compute node log: {len(warnings)} warnings/errors; the first ones:")
    for line in warnings[:8]:
        print("  " + line[:300])
    for f in failures:
        print("FAIL " + f)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
