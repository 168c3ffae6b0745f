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
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SOURCE, "tests", "deploy"))
import metrics_contract  # noqa: E402  (docs/metrics.md, which the dashboard is checked against)


def exported_families(port):
    """{name: type} of the magicpig_* families a node's /metrics declares."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"] and parts[2].startswith("magicpig_"):
            out[parts[2]] = parts[3]
    return out


def check_contract(contract, kind_prefix, exported):
    """The node exports exactly the contract's metrics for its kind, with the contract's types
    (so the Grafana dashboard and alert rules, checked against the contract, use real names)."""
    want = {m.name: m.type for m in contract.values()
            if any(k.startswith(kind_prefix) for k in m.node_kinds)}
    # A family with no series is not printed at all; the error counter has none until a call
    # fails (its labels are the failing node and status code). remote_attention_shards_test checks
    # that failures are counted under this name.
    missing = sorted(set(want) - set(exported) - {"magicpig_attn_rpc_errors_total"})
    extra = sorted(set(exported) - set(want))
    wrong = sorted(n for n in want if n in exported and exported[n] != want[n])
    assert not (missing or extra or wrong), (
        "%s node vs docs/metrics.md: missing %s, not in the contract %s, wrong type %s" %
        (kind_prefix, missing, extra, wrong))


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
                                 "--threads", "1", "--insecure"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        procs.append(attn)
        m = re.match(r"listening on (.+)", attn.stdout.readline().strip())
        assert m, "attention node did not start"
        gpu = subprocess.Popen([GPU_NODE, "--model", MODEL, "--listen", "127.0.0.1:0",
                                "--threads", "1", "--attention-nodes", m.group(1),
                                # short prompts: offload them to the node anyway
                                "--sparse-min-keys", "1", "--insecure"],
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
        # Finished requests released their shards: the attention node holds nothing again.
        wait_for("shards released", lambda: query(prom, "magicpig_attn_kv_tokens") and value(
            prom, "magicpig_attn_sequences") == 0 and value(prom, "magicpig_attn_kv_bytes") == 0)
        # A client that goes away mid-stream: its request is cancelled and its shards on the
        # attention node are released (seen through Prometheus: held while streaming, then gone).
        sock = socket.create_connection(("127.0.0.1", api))
        body = json.dumps({"prompt": prompt, "max_tokens": 2000, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 2:
            got += sock.recv(4096)
        wait_for("the streaming request's shards held",
                 lambda: (value(prom, "magicpig_attn_sequences") or 0) >= 1)
        sock.close()
        wait_for("the cancelled request's shards released",
                 lambda: value(prom, "magicpig_attn_sequences") == 0 and value(
                     prom, 'magicpig_request_success_total{finished_reason="abort"}') == 1)
        contract = metrics_contract.load(os.path.join(SOURCE, "docs", "metrics.md"))
        check_contract(contract, "Compute", exported_families(api))
        check_contract(contract, "Attention", exported_families(attn_metrics))
        print("ok: both node kinds scraped; series present and moving; names == docs/metrics.md")
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
