#!/usr/bin/env python3
"""Interop test of common/http's server with independent clients: Python's http.client (standard
library) and, when installed, curl.

    http_client_test.py PATH/TO/http_interop_server

Starts the server (it prints "listening on 127.0.0.1:PORT"), then checks: keep-alive POSTs on one
connection, a chunked upload, a large upload, reading a chunked Server-Sent Events stream line by
line and reusing the connection after it, JSON 404 / 405 error bodies, and with curl an upload
after "Expect: 100-continue", a chunked upload and a streamed download. Closing the server's
standard input shuts it down; it must exit 0.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile

FAILURES = []
CHECKS = [0]


def check(cond, what):
    CHECKS[0] += 1
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}")


def keep_alive_posts(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    sockets = set()
    for i in range(5):
        body = f"request {i} ".encode() * (i + 1)
        conn.request("POST", "/echo", body=body, headers={"Content-Type": "text/plain"})
        sockets.add(id(conn.sock))
        resp = conn.getresponse()
        data = resp.read()
        check(resp.status == 200, f"keep-alive POST {i}: status {resp.status}")
        check(data == body, f"keep-alive POST {i}: echoed body")
        check(resp.getheader("X-Chunked") == "no", f"keep-alive POST {i}: not chunked")
        check(not resp.will_close, f"keep-alive POST {i}: connection kept")
    check(len(sockets) == 1, f"keep-alive: one socket for 5 requests, got {len(sockets)}")

    # A chunked upload: http.client encodes an iterable body without Content-Length as chunked.
    pieces = [b"first piece, ", b"", b"second piece, ", b"x" * 5000, b" end"]
    conn.request("POST", "/echo", body=iter(pieces), encode_chunked=True)
    resp = conn.getresponse()
    data = resp.read()
    check(resp.status == 200, f"chunked upload: status {resp.status}")
    check(resp.getheader("X-Chunked") == "yes", "chunked upload: the server saw chunked framing")
    check(data == b"".join(pieces), "chunked upload: echoed body")

    big = os.urandom(300_000)
    conn.request("POST", "/echo", body=big)
    resp = conn.getresponse()
    check(resp.read() == big, "300 KB upload echoed")
    conn.close()


def stream(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/stream?20", headers={"Accept": "text/event-stream"})
    resp = conn.getresponse()
    check(resp.status == 200, f"stream: status {resp.status}")
    check(resp.getheader("Transfer-Encoding") == "chunked", "stream: chunked")
    check(resp.getheader("Content-Type") == "text/event-stream", "stream: content type")
    events = []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.rstrip(b"\n")
        if line.startswith(b"data: "):
            events.append(line[len(b"data: "):].decode())
            if events[-1] == "[DONE]":
                break
    rest = resp.read()  # the event's blank line, then the terminating chunk
    check(rest == b"\n", f"stream: only the blank line after [DONE], got {rest!r}")
    check(events[-1:] == ["[DONE]"], "stream: ends with [DONE]")
    check([json.loads(e)["i"] for e in events[:-1]] == list(range(20)), "stream: 20 events")
    # The connection is reusable after the stream.
    conn.request("GET", "/healthz")
    resp = conn.getresponse()
    check(resp.read() == b"ok\n", "healthz after a stream on the same connection")
    conn.close()


def errors(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/nothing")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    check(resp.status == 404, f"404: status {resp.status}")
    check(resp.getheader("Content-Type") == "application/json", "404: JSON")
    check(body["error"]["code"] == 404 and "/v1/nothing" in body["error"]["message"],
          f"404: error object {body}")
    conn.request("GET", "/echo")
    resp = conn.getresponse()
    resp.read()
    check(resp.status == 405, f"405: status {resp.status}")
    check(resp.getheader("Allow") == "POST", f"405: Allow {resp.getheader('Allow')}")
    conn.close()


def curl(port, curl_bin):
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        payload = os.path.join(tmp, "payload")
        data = os.urandom(200_000)
        with open(payload, "wb") as f:
            f.write(data)
        # Upload after "Expect: 100-continue".
        out = subprocess.run([curl_bin, "-sS", "-v", "--http1.1", "-H", "Expect: 100-continue",
                              "--data-binary", f"@{payload}", f"{base}/echo"],
                             capture_output=True, timeout=30)
        check(out.returncode == 0, f"curl expect: exit {out.returncode} {out.stderr[-300:]!r}")
        check(out.stdout == data, "curl expect: echoed body")
        check(b"HTTP/1.1 100 Continue" in out.stderr, "curl expect: got 100 Continue")
        # Chunked upload.
        out = subprocess.run([curl_bin, "-sS", "--http1.1", "-H", "Transfer-Encoding: chunked",
                              "-D", "-", "--data-binary", f"@{payload}", f"{base}/echo"],
                             capture_output=True, timeout=30)
        check(out.returncode == 0, f"curl chunked: exit {out.returncode}")
        check(b"X-Chunked: yes" in out.stdout and out.stdout.endswith(data),
              "curl chunked: echoed body")
        # Streamed download.
        out = subprocess.run([curl_bin, "-sS", "-N", f"{base}/stream?3"], capture_output=True,
                             timeout=30)
        want = b"".join(b'data: {"i": %d}\n\n' % i for i in range(3)) + b"data: [DONE]\n\n"
        check(out.stdout == want, f"curl stream: {out.stdout!r}")


def main():
    server_bin = sys.argv[1]
    proc = subprocess.Popen([server_bin], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            print(f"FAIL: server did not start: {line!r}")
            return 1
        port = int(line.rsplit(":", 1)[1])
        keep_alive_posts(port)
        stream(port)
        errors(port)
        curl_bin = shutil.which("curl")
        if curl_bin:
            curl(port, curl_bin)
        else:
            print("note: curl not found, curl checks skipped")
        proc.stdin.close()
        code = proc.wait(timeout=15)
        check(code == 0, f"server exit code {code}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"{CHECKS[0] - len(FAILURES)}/{CHECKS[0]} checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
