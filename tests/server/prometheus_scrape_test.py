"""A real Prometheus server scrapes both node kinds; the series are checked through its HTTP query
API, before and after requests run.

Starts a magicpig_attn_node (gRPC + HTTP metrics port), a magicpig_gpu_node using it, and
`prometheus` (Debian package) with a 1 s scrape interval over both /metrics endpoints; waits until
both targets are up, runs a few completions through the API, and requires that the compute node's
generation/prompt token counters and the attention node's Attend counter rise in Prometheus and
that the attention node's memory gauges are present.

usage: prometheus_scrape_test.py GPU_NODE ATTN_NODE MODEL
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

GPU_NODE, ATTN_NODE, MODEL = sys.argv[1:4]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url, data=None):
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def query(prom, expr):
    out = get("http://127.0.0.1:%d/api/v1/query?query=%s" % (prom, urllib.parse.quote(expr)))
    assert out["status"] == "success", out
    return out["data"]["result"]


def value(prom, expr):
    r = query(prom, expr)
    return sum(float(x["value"][1]) for x in r) if r else None


def wait_for(what, predicate, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError("timed out waiting for " + what)


def main():
    if shutil.which("prometheus") is None:
        print("SKIP: prometheus not installed (Debian package prometheus)")
        return 77
    procs = []
    tmp = tempfile.mkdtemp(prefix="magicpig-prom-")
    try:
        attn_metrics = free_port()
        attn = subprocess.Popen([ATTN_NODE, "--listen", "127.0.0.1:0", "--metrics-listen",
                                 "127.0.0.1:%d" % attn_metrics, "--memory-budget", "1G",
                                 "--threads", "1"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        procs.append(attn)
        m = re.match(r"listening on (.+)", attn.stdout.readline().strip())
        assert m, "attention node did not start"
        gpu = subprocess.Popen([GPU_NODE, "--model", MODEL, "--listen", "127.0.0.1:0",
                                "--threads", "1", "--attention-nodes", m.group(1)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(gpu)
        g = re.match(r"listening on .+:(\d+)", gpu.stdout.readline())
        assert g, "compute node did not start"
        api = int(g.group(1))
        prom = free_port()
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n"
                    "  - job_name: magicpig-gpu-node\n"
                    "    static_configs: [{targets: ['127.0.0.1:%d']}]\n"
                    "  - job_name: magicpig-attn\n"
                    "    static_configs: [{targets: ['127.0.0.1:%d']}]\n" % (api, attn_metrics))
        procs.append(subprocess.Popen(
            ["prometheus", "--config.file", config, "--storage.tsdb.path",
             os.path.join(tmp, "data"), "--web.listen-address", "127.0.0.1:%d" % prom],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def targets_up():
            try:
                t = get("http://127.0.0.1:%d/api/v1/targets" % prom)["data"]["activeTargets"]
            except OSError:
                return False
            return len(t) == 2 and all(x["health"] == "up" for x in t)

        wait_for("both targets up", targets_up)
        for name in ("magicpig_build_info", "magicpig_attn_memory_budget_bytes",
                     "magicpig_attn_kv_bytes", "magicpig_attn_hash_table_bytes",
                     "magicpig_num_requests_running"):
            wait_for(name, lambda: query(prom, name))
        tokens_before = value(prom, "magicpig_generation_tokens_total") or 0
        attends_before = value(prom, "magicpig_attn_attend_requests_total") or 0
        # A prompt long enough that keys leave the static window for the attention node.
        prompt = " ".join("The harbour gate opens at dawn and closes at dusk." for _ in range(40))
        for _ in range(3):
            out = get("http://127.0.0.1:%d/v1/completions" % api,
                      json.dumps({"prompt": prompt, "max_tokens": 8}).encode())
            assert out["usage"]["completion_tokens"] == 8, out
        wait_for("generation tokens +24 in Prometheus",
                 lambda: value(prom, "magicpig_generation_tokens_total") == tokens_before + 24)
        wait_for("Attend requests counted in Prometheus",
                 lambda: (value(prom, "magicpig_attn_attend_requests_total") or 0) > attends_before)
        wait_for("TTFT histogram", lambda: value(
            prom, "magicpig_time_to_first_token_seconds_count") == 3)
        wait_for("RPC latency per node", lambda: query(
            prom, "magicpig_attn_rpc_latency_seconds_count"))
        print("ok: both node kinds scraped; series present and moving")
        return 0
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
