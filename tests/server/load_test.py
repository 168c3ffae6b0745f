"""Load test of the compute node: concurrent streaming clients on loopback, bounded in count.

For each --max-batch value it starts a real magicpig_gpu_node, runs CLIENTS threads that each send
REQUESTS streaming chat requests (raw http.client, SSE parsed by hand), and checks that no request
failed or was lost and that every stream is well-formed: `data: ` events of valid JSON with one
id, a role first, exactly one finish_reason, the usage chunk last when asked, then `data: [DONE]`.
It prints generated tokens per second per batch size and the ratio against the first (batch 1):
a measurement, not an assertion.

usage: load_test.py GPU_NODE MODEL [--clients 16] [--requests 2] [--max-tokens 32]
                    [--batches 1,8] [--threads 2]
"""
import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time

PROMPTS = ["Tell me about cats.", "List three colours.", "What is 2 + 2?", "Name a planet.",
           "Write a haiku about rain.", "Say hello in French.", "Why is the sky blue?",
           "Give me a word that rhymes with moon."]


def start(node, model, batch, threads, queue):
    proc = subprocess.Popen([node, "--model", model, "--listen", "127.0.0.1:0", "--threads",
                             str(threads), "--max-batch", str(batch), "--max-queue", str(queue)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    m = re.match(r"listening on .+:(\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise RuntimeError("server did not start")
    return proc, int(m.group(1))


def check_stream(data):
    """Returns the completion tokens of a well-formed SSE chat stream, or raises."""
    events = data.split("\n\n")
    if events[-1] != "" or events[-2] != "data: [DONE]":
        raise AssertionError("stream does not end with data: [DONE]: %r" % data[-80:])
    chunks = []
    for e in events[:-2]:
        if not e.startswith("data: "):
            raise AssertionError("not an SSE data event: %r" % e[:80])
        chunks.append(json.loads(e[6:]))
    if len({c["id"] for c in chunks}) != 1:
        raise AssertionError("chunk ids differ")
    if chunks[0]["choices"][0]["delta"].get("role") != "assistant":
        raise AssertionError("first delta has no role")
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    if sum(f is not None for f in finishes) != 1 or finishes[-1] is None:
        raise AssertionError("finish_reason not exactly once at the end: %r" % finishes)
    usage = chunks[-1]
    if usage["choices"] != [] or usage["usage"] is None:
        raise AssertionError("no usage chunk before [DONE]")
    return usage["usage"]["completion_tokens"]


def run(port, clients, requests, max_tokens):
    tokens, failures = [], []
    lock = threading.Lock()

    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        for r in range(requests):
            body = json.dumps({
                "messages": [{"role": "user", "content": PROMPTS[(i + r) % len(PROMPTS)]}],
                "max_tokens": max_tokens, "temperature": 0.7, "seed": i * 1000 + r,
                "stream": True, "stream_options": {"include_usage": True}})
            try:
                conn.request("POST", "/v1/chat/completions", body,
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read().decode()
                if resp.status != 200:
                    raise AssertionError("HTTP %d: %s" % (resp.status, data[:200]))
                n = check_stream(data)
                with lock:
                    tokens.append(n)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append("client %d request %d: %s" % (i, r, e))
        conn.close()

    start = time.time()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - start, tokens, failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("node")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    results = []
    ok = True
    for batch in [int(b) for b in a.batches.split(",")]:
        proc, port = start(a.node, a.model, batch, a.threads, a.clients)
        try:
            seconds, tokens, failures = run(port, a.clients, a.requests, a.max_tokens)
        finally:
            proc.terminate()
            proc.wait(60)
        expected = a.clients * a.requests
        lost = expected - len(tokens) - len(failures)
        rate = sum(tokens) / seconds
        results.append(rate)
        print("max-batch %2d: %d/%d requests ok, %d failed, %d lost, %d tokens in %.1f s = "
              "%.1f tok/s (x%.2f vs max-batch %s)" % (
                  batch, len(tokens), expected, len(failures), lost, sum(tokens), seconds, rate,
                  rate / results[0], a.batches.split(",")[0]))
        for f in failures[:5]:
            print("  " + f)
        ok = ok and not failures and lost == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
