"""The compute node's HTTP API through clients nobody here wrote: the official `openai` Python
client, plus raw http.client requests for what the client does not send (malformed bodies).

Starts a real magicpig_gpu_node on the real model (loopback, a free port) and checks:
completions and chat against the embedded CLI's greedy output (`magicpig run`), streaming chat
(SSE well-formed, deltas concatenate to the non-streamed text, the include_usage chunk), the
lm-evaluation-harness log-likelihood request shape (echo + logprobs), concurrent requests batched
together giving each its own sequential result, OpenAI-style errors (401, 404, 400, 413), client
disconnect cancelling the request, /metrics passing `promtool check metrics` with series that
move, and a graceful SIGTERM drain.

usage: openai_client_test.py GPU_NODE MAGICPIG_CLI MODEL
"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import openai

GPU_NODE, CLI, MODEL = sys.argv[1:4]
KEY = "test-key-123"
NAME = "smollm2"
THREADS = "2"


# AVX-512's single-token Q4_1 decode kernel sums in another order than its multi-token kernel,
# so a sequence decoded in a batch can differ from batch-1 decoding by float rounding (as in
# vLLM and llama.cpp). The AVX2 and scalar kernels are batch-invariant; capping the SIMD level
# there lets the test require exactly the sequential tokens from concurrent requests.
ENV = dict(os.environ, MAGICPIG_SIMD="avx2")


def start_server(*extra):
    proc = subprocess.Popen(
        [GPU_NODE, "--model", MODEL, "--listen", "127.0.0.1:0", "--threads", THREADS,
         "--served-model-name", NAME, "--max-batch", "4", "--max-queue", "8", "--max-body",
         "64K", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    line = proc.stdout.readline()
    m = re.match(r"listening on (.+):(\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError("server did not start: %r" % line)
    return proc, int(m.group(2))


def cli_greedy(prompt, max_tokens, chat=False):
    args = [CLI, "run", "--model", MODEL, "--prompt", prompt, "--max-tokens", str(max_tokens),
            "--threads", THREADS]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=ENV).stdout
    return out[:-1] if out.endswith("\n") else out  # the CLI ends its output with a newline


class Server:
    proc = None
    port = None


def raw(method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", Server.port, timeout=120)
    h = {"Authorization": "Bearer " + KEY}
    h.update(headers or {})
    conn.request(method, path, body=body, headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("Content-Type"), data


def metric(name):
    status, _, text = raw("GET", "/metrics")
    assert status == 200
    total = 0.0
    found = False
    for line in text.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


class OpenAIClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        Server.proc, Server.port = start_server("--api-key", KEY)
        cls.client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % Server.port, api_key=KEY,
                                   max_retries=0, timeout=300)

    @classmethod
    def tearDownClass(cls):
        if Server.proc.poll() is None:
            Server.proc.kill()
        Server.proc.wait()

    def test_models(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], [NAME])

    def test_completion_matches_the_embedded_cli(self):
        prompt = "The capital of France is"
        r = self.client.completions.create(model=NAME, prompt=prompt, max_tokens=12,
                                           temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].text, cli_greedy(prompt, 12))
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 12)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 12)

    def test_chat_matches_the_embedded_cli_and_streams_the_same_text(self):
        question = "What is the capital of France? Answer in one word."
        msgs = [{"role": "user", "content": question}]
        r = self.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=16,
                                                temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].message.content, cli_greedy(question, 16, chat=True))
        stream = self.client.chat.completions.create(
            model=NAME, messages=msgs, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, r.choices[0].message.content)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finish[-1], r.choices[0].finish_reason)
        self.assertTrue(all(f is None for f in finish[:-1]))
        self.assertEqual(chunks[-1].choices, [])  # the usage chunk comes last, before [DONE]
        self.assertEqual(chunks[-1].usage.total_tokens, r.usage.total_tokens)
        self.assertTrue(all(c.usage is None for c in chunks[:-1]))

    def test_raw_stream_framing(self):
        body = json.dumps({"model": NAME, "prompt": "Once upon a time", "max_tokens": 6,
                           "temperature": 0, "stream": True})
        status, ctype, data = raw("POST", "/v1/completions", body,
                                  {"Content-Type": "application/json"})
        self.assertEqual(status, 200)
        self.assertTrue(ctype.startswith("text/event-stream"))
        events = data.decode().split("\n\n")
        self.assertEqual(events[-1], "")
        self.assertEqual(events[-2], "data: [DONE]")
        for e in events[:-2]:
            self.assertTrue(e.startswith("data: "), e)
            json.loads(e[6:])

    def test_loglikelihood_request_as_lm_eval_sends_it(self):
        def tokenize(text):
            status, _, data = raw("POST", "/tokenize", json.dumps({"prompt": text}))
            self.assertEqual(status, 200)
            return json.loads(data)["tokens"]

        ids = tokenize("The sky is blue and the grass is")
        cont = tokenize(" green")
        r = self.client.completions.create(model=NAME, prompt=[ids + cont], max_tokens=1,
                                           temperature=0, logprobs=1, echo=True, seed=1234)
        lp = r.choices[0].logprobs
        n = len(ids) + len(cont)
        self.assertEqual(len(lp.token_logprobs), n + 1)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs[1:]))
        ctxlen = len(ids)
        continuation = sum(lp.token_logprobs[ctxlen:-1])
        self.assertLess(continuation, 0)
        # is_greedy as the harness computes it: each continuation token is the top-1 entry.
        for pos in range(ctxlen, n):
            top = lp.top_logprobs[pos]
            self.assertEqual(len(top), 1)
            best = max(top.values())
            self.assertLessEqual(lp.token_logprobs[pos], best + 1e-6)

    def test_concurrent_requests_get_their_sequential_results(self):
        prompts = ["Tell me about cats.", "List three colours.", "What is 2 + 2?",
                   "Name a planet.", "Write a haiku about rain.", "Say hello in French."]
        expected = {}
        for p in prompts:
            expected[p] = self.client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": p}], max_tokens=20,
                temperature=0).choices[0].message.content
        got = {}
        errors = []

        def run(p):
            try:
                s = self.client.chat.completions.create(
                    model=NAME, messages=[{"role": "user", "content": p}], max_tokens=20,
                    temperature=0, stream=True)
                got[p] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        steps_before = metric("magicpig_batch_size_count")
        tokens_before = metric("magicpig_batch_size_sum")
        threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(got, expected)
        steps = metric("magicpig_batch_size_count") - steps_before
        tokens = metric("magicpig_batch_size_sum") - tokens_before
        self.assertLess(steps, tokens, "no decode step ran more than one sequence")

    def test_errors_are_openai_shaped(self):
        bad = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % Server.port, api_key="wrong",
                            max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
        self.assertEqual(e.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=NAME, prompt="x", max_tokens=10 ** 6)
        self.assertEqual(e.exception.body["param"], "max_tokens")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=NAME, messages=[], max_tokens=1)
        self.assertEqual(e.exception.body["param"], "messages")
        status, ctype, data = raw("POST", "/v1/completions", b"{not json",
                                  {"Content-Type": "application/json"})
        self.assertEqual(status, 400)
        self.assertEqual(ctype, "application/json")
        self.assertIn("not valid JSON", json.loads(data)["error"]["message"])
        status, _, data = raw("POST", "/v1/completions", b"x" * (100 * 1024))
        self.assertEqual(status, 413)
        self.assertIn("error", json.loads(data))
        status, _, data = raw("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertIn("error", json.loads(data))
        # Probes and metrics need no key.
        conn = http.client.HTTPConnection("127.0.0.1", Server.port, timeout=10)
        for path in ("/healthz", "/readyz", "/health", "/metrics"):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            self.assertEqual(resp.status, 200, path)
        conn.close()
        # The server still serves.
        r = self.client.completions.create(model=NAME, prompt="Hi", max_tokens=2)
        self.assertEqual(len(r.choices), 1)

    def test_client_disconnect_cancels_the_request(self):
        aborted_before = metric('magicpig_request_success_total{finished_reason="abort"}') or 0
        sock = socket.create_connection(("127.0.0.1", Server.port))
        body = json.dumps({"model": NAME, "prompt": "Count to a thousand:", "max_tokens": 2000,
                           "stream": True, "temperature": 0}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                     KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
                     str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        sock.close()
        deadline = time.time() + 30
        while time.time() < deadline:
            aborted = metric('magicpig_request_success_total{finished_reason="abort"}') or 0
            if aborted > aborted_before and metric("magicpig_num_requests_running") == 0:
                break
            time.sleep(0.2)
        self.assertGreater(aborted, aborted_before)
        self.assertEqual(metric("magicpig_num_requests_running"), 0)

    def test_metrics_pass_promtool_and_move(self):
        before = metric("magicpig_generation_tokens_total")
        self.client.completions.create(model=NAME, prompt="One two three", max_tokens=3)
        self.assertEqual(metric("magicpig_generation_tokens_total"), before + 3)
        _, ctype, text = raw("GET", "/metrics")
        self.assertTrue(ctype.startswith("text/plain"))
        for name in ("magicpig_time_to_first_token_seconds_count",
                     "magicpig_e2e_request_latency_seconds_count", "magicpig_prompt_tokens_total",
                     "magicpig_http_requests_total", "magicpig_build_info",
                     "magicpig_decode_phase_seconds_total"):
            self.assertIsNotNone(metric(name), name)
        promtool = shutil.which("promtool")
        if promtool is None:
            self.skipTest("promtool not installed (Debian package prometheus)")
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)


class ShutdownTest(unittest.TestCase):
    def test_sigterm_finishes_in_flight_requests_then_exits(self):
        proc, port = start_server("--shutdown-grace", "60")
        try:
            client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none",
                                   max_retries=0, timeout=120)
            result = {}

            def run():
                result["r"] = client.completions.create(model=NAME, prompt="Once upon a time",
                                                        max_tokens=40, temperature=0)

            t = threading.Thread(target=run)
            t.start()
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            t.join(120)
            self.assertEqual(result["r"].usage.completion_tokens, 40)
            self.assertEqual(proc.wait(60), 0)
        finally:
            if proc.poll() is None:
                proc.kill()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
