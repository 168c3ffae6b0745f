#!/usr/bin/env python3
"""A client that half-closes its socket after sending the request (shutdown(SHUT_WR), as `nc -N`
and some proxies do) still gets its whole response; a client that closes the socket has its
request cancelled (issue #36).

    half_close_test.py PATH/TO/magicpig_gpu_node MODEL.gguf EXAMPLE_TEXT

Starts the compute node (embedded) on 127.0.0.1:0 and sends a ~1,600-token prompt, so that the
prefill keeps the handler waiting with nothing to write while the half-close arrives. Checks, for
a plain and a streaming completion: status 200, a body that parses (JSON, or SSE ending in
[DONE]) with the requested tokens; then that a client closing during the prefill is counted as an
abort in /metrics and its tokens are never generated.
"""
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

FAILURES = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILURES.append(what)


def start(binary, model):
    proc = subprocess.Popen([binary, "--model", model, "--listen", "127.0.0.1:0", "--threads",
                             "2", "--log-level", "warning"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if m:
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the compute node did not start")


def request_bytes(prompt, max_tokens, stream):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": stream,
                       "ignore_eos": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def read_all(sock):
    sock.settimeout(120)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def dechunk(body):
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


def parse(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = dechunk(body)
    return status, body.decode()


def metric(address, series):
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def main():
    binary, model, example = sys.argv[1:4]
    with open(example) as f:
        prompt = f.read()[:8000]  # ~1,600 tokens
    proc, address = start(binary, model)
    host, port = address.rsplit(":", 1)
    try:
        for stream in (False, True):
            what = "streaming" if stream else "plain"
            sock = socket.create_connection((host, int(port)))
            sock.sendall(request_bytes(prompt, 8, stream))
            sock.shutdown(socket.SHUT_WR)
            status, body = parse(read_all(sock))
            sock.close()
            check(status == 200, f"{what}: half-closed client gets 200 (got {status})")
            if stream:
                events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
                check(events and events[-1] == "[DONE]", f"{what}: the stream ends with [DONE]")
                tokens = sum(1 for e in events[:-1] if json.loads(e)["choices"])
                check(tokens >= 8, f"{what}: at least 8 token events (got {tokens})")
            else:
                try:
                    got = json.loads(body)["usage"]["completion_tokens"]  # whitespace first: valid
                except (ValueError, KeyError, TypeError):
                    got = f"no completion: {body[:120]!r}"
                check(got == 8, f"{what}: 8 completion tokens (got {got})")
        aborts = 'magicpig_request_success_total{finished_reason="abort"}'
        before_aborts = metric(address, aborts)
        before_tokens = metric(address, "magicpig_generation_tokens_total")
        for stream in (False, True):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(request_bytes(prompt, 400, stream))
            time.sleep(0.3)  # in the prefill
            sock.close()
        # Until both are counted: a request that was not cancelled runs its 400 tokens and ends
        # as "length" instead, so the count stays short of 2 and the check below fails. Polled,
        # not slept, so that a loaded machine only makes the test slower.
        deadline = time.time() + 180
        while metric(address, aborts) - before_aborts < 2 and time.time() < deadline:
            time.sleep(0.5)
        check(metric(address, aborts) - before_aborts == 2,
              "closed clients' requests are aborted (magicpig_request_success_total{abort} +2)")
        generated = metric(address, "magicpig_generation_tokens_total") - before_tokens
        check(generated < 800, f"closed clients' tokens were not all generated ({generated:.0f})")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"{len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
