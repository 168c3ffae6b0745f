"""Self-check of scripts/check-deploy (CTest: deploy_check_negative): the check must pass on an
unmodified copy of the repository and FAIL, naming the problem, on copies broken one way each.

  negative_check.py [SOURCE_DIR]

Each mutation replaces one exact string in one file (the string must occur exactly once, so a
mutation that no longer applies fails this test instead of passing vacuously) and names the
section and a phrase the check must print.
"""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_deploy.py")
SKIP_DIRS = {".git", ".venv", "models", "out", "fuzz-out", "__pycache__"}

# (name, file, old, new, failing section, phrase expected in the output)
MUTATIONS = [
    ("trailing spaces", "deploy/base/attn-node-pdb.yaml",
     "  maxUnavailable: 1\n", "  maxUnavailable: 1   \n", "yamllint", "trailing-spaces"),
    ("misspelt field", "deploy/base/attn-node-statefulset.yaml",
     "podManagementPolicy: Parallel", "podManagmentPolicy: Parallel", "schemas",
     "podManagmentPolicy"),
    ("wrong type", "deploy/base/attn-node-statefulset.yaml",
     "  minReadySeconds: 10", "  minReadySeconds: ten", "schemas", "minReadySeconds"),
    ("not Guaranteed QoS", "deploy/base/attn-node-statefulset.yaml",
     "            limits:\n              cpu: \"2\"\n              memory: 8Gi",
     "            limits:\n              cpu: \"2\"\n              memory: 9Gi",
     "semantics", "Guaranteed QoS"),
    ("liveness on readiness", "deploy/base/gpu-node-deployment.yaml",
     "          livenessProbe:\n            httpGet:\n              path: /healthz",
     "          livenessProbe:\n            httpGet:\n              path: /readyz",
     "semantics", "livenessProbe probes /readyz"),
    ("short startup budget", "deploy/base/gpu-node-deployment.yaml",
     "            failureThreshold: 60", "            failureThreshold: 20",
     "semantics", "startupProbe allows 200 s"),
    ("replicas without the node list", "deploy/base/attn-node-statefulset.yaml",
     "  replicas: 2", "  replicas: 3", "semantics", "--attention-nodes is"),
    ("budget above the limit", "deploy/base/attn-node.env",
     "MAGICPIG_MEMORY_BUDGET=6G", "MAGICPIG_MEMORY_BUDGET=8G", "semantics",
     "memory limit 8Gi is below"),
    ("flags in the image's CMD", "deploy/docker/attn_node.Dockerfile",
     'ENTRYPOINT ["/usr/local/bin/magicpig_attn_node"]',
     'ENTRYPOINT ["/usr/local/bin/magicpig_attn_node"]\nCMD ["--listen", "0.0.0.0:50051"]',
     "docker", "CMD passes flags"),
    ("variable that is no flag", "deploy/base/gpu-node.env",
     "MAGICPIG_CTX=8192\n", "MAGICPIG_CONTEXT=8192\n", "semantics",
     "sets MAGICPIG_CONTEXT, which is not a flag of magicpig_gpu_node"),
    ("node flag on the compute node", "deploy/base/gpu-node.env",
     "MAGICPIG_MAX_QUEUE=64\n", "MAGICPIG_MAX_QUEUE=64\nMAGICPIG_MEMORY_BUDGET=2G\n", "semantics",
     "sets MAGICPIG_MEMORY_BUDGET, which is not a flag of magicpig_gpu_node"),
    ("plaintext fabric", "deploy/base/gpu-node.env",
     "MAGICPIG_MAX_QUEUE=64\n", "MAGICPIG_MAX_QUEUE=64\nMAGICPIG_INSECURE=true\n", "semantics",
     "MAGICPIG_INSECURE turns off mTLS"),
    ("attention gRPC open to all", "deploy/base/network-policies.yaml",
     "    - from:\n        - podSelector:\n            matchLabels:\n"
     "              app.kubernetes.io/name: magicpig\n"
     "              app.kubernetes.io/component: gpu-node\n      ports:",
     "    - ports:", "semantics", "reach the attention nodes' gRPC port"),
    ("compute metrics open to all", "deploy/base/network-policies.yaml",
     "  ingress:\n    - ports:\n        - port: http\n          protocol: TCP\n",
     "  ingress:\n    - ports:\n        - port: http\n          protocol: TCP\n"
     "        - port: metrics\n          protocol: TCP\n", "semantics",
     "opens the compute nodes' metrics port to everyone"),
    ("certificate without the probe's name", "deploy/tls/cert-manager/node-certificates.yaml",
     "    - localhost\n", "", "semantics", "do not name localhost"),
    ("TLS key outside the Secret", "deploy/base/attn-node.env",
     "MAGICPIG_TLS_KEY=/etc/magicpig/tls/tls.key", "MAGICPIG_TLS_KEY=/tmp/tls.key", "semantics",
     "is not in a mounted Secret"),
    ("attention Service not headless", "deploy/base/attn-node-service.yaml",
     "  clusterIP: None\n", "", "semantics", "must be headless"),
    ("grace shorter than the drain", "deploy/base/attn-node-statefulset.yaml",
     "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 20", "semantics",
     "does not cover --shutdown-grace"),
    ("no GPU in the CUDA overlay", "deploy/overlays/cuda/gpu-node-gpu.yaml",
     "            limits:\n              nvidia.com/gpu: 1\n", "            limits:\n",
     "semantics", "must request and limit nvidia.com/gpu"),
    ("fetch-model copy drifted", "deploy/base/fetch-model",
     'echo "fetch-model: wrote $DEST"', 'echo "fetch-model: wrote $DEST (copy)"', "semantics",
     "differs from scripts/fetch-model"),
    ("file outside the kustomization", "deploy/base/kustomization.yaml",
     "      - fetch-model\n", "      - ../../scripts/fetch-model\n", "render",
     "is not in or below"),
    ("misspelt kustomization field", "deploy/overlays/cuda/kustomization.yaml",
     "patches:\n  - path: gpu-node-gpu.yaml", "patch:\n  - path: gpu-node-gpu.yaml", "render",
     'unknown field "patch"'),
    ("ServiceMonitor port", "deploy/monitoring/servicemonitor-attn-node.yaml",
     "    - port: metrics", "    - port: prom", "monitoring", "endpoint port prom"),
    ("metric not in the contract", "deploy/grafana/magicpig-dashboard.json",
     "sum by (pod) (magicpig_attn_kv_bytes{", "sum by (pod) (magicpig_attn_kv_size_bytes{",
     "metrics", "magicpig_attn_kv_size_bytes is not in docs/metrics.md"),
    ("histogram suffix on a gauge", "deploy/grafana/magicpig-dashboard.json",
     "sum (magicpig_num_requests_waiting{", "sum (magicpig_num_requests_waiting_count{",
     "metrics", "is a gauge, not a histogram"),
    ("label the metric lacks", "deploy/grafana/magicpig-dashboard.json",
     "sum by (node, code) (rate(magicpig_attn_rpc_errors_total",
     "sum by (node, reason) (rate(magicpig_attn_rpc_errors_total", "metrics",
     "grouping by reason"),
    ("contract row removed", "docs/metrics.md",
     "| `magicpig_batch_size` | histogram | — | sequences per decode step |\n", "",
     "metrics", "magicpig_batch_size_bucket is not in docs/metrics.md"),
    ("PromQL syntax", "deploy/grafana/magicpig-dashboard.json",
     "histogram_quantile(0.99, sum by (le, node)", "histogram_quantile(0.99 sum by (le, node)",
     "prometheus", "does not parse"),
    ("scrape config", "deploy/prometheus/prometheus.yml",
     "  scrape_interval: 15s", "  scrape_interval: 15 seconds", "prometheus",
     "promtool check config"),
    ("alert threshold", "deploy/prometheus/magicpig-rules.yml",
     "(magicpig_attn_memory_usage_ratio) > 0.9", "(magicpig_attn_memory_usage_ratio) > 0.99",
     "prometheus", "promtool test rules"),
    ("scrape selector", "deploy/prometheus/prometheus.yml",
     "regex: magicpig;attn-node;metrics", "regex: magicpig;attn-node;prom", "prometheus",
     "keep rule matches 0 workloads"),
    ("root user", "deploy/docker/attn_node.Dockerfile",
     "USER 10001:10001\n", "", "docker", "non-root USER"),
    ("base image", "deploy/docker/gpu_node.Dockerfile",
     "ARG DEBIAN_RELEASE=bookworm", "ARG DEBIAN_RELEASE=bullseye", "docker",
     "is not debian:bookworm"),
    ("model in the build context", ".dockerignore",
     "\nmodels\n", "\n", "docker", "does not exclude models/"),
    ("dead path in the guide", "docs/deploy.md",
     "`deploy/examples/autoscaling/keda-scaledobject.yaml`: a KEDA",
     "`deploy/examples/autoscaling/keda.yaml`: a KEDA", "docs", "does not exist"),
    ("dead kustomization in the guide", "docs/deploy.md",
     "kubectl apply -k deploy/monitoring", "kubectl apply -k deploy/monitor", "docs",
     "no kustomization there"),
]


def copy_tree(src, dst):
    top = os.path.abspath(src)

    def ignore(folder, names):
        # Build folders (build/, build-*/) only at the top: scripts/build is a source file.
        return [n for n in names if n in SKIP_DIRS
                or (os.path.abspath(folder) == top and n.startswith("build"))]
    shutil.copytree(src, dst, ignore=ignore, symlinks=True)


def run_check(root):
    # The kubectl is check_deploy.py's default: $MAGICPIG_KUBECTL (scripts/check-deploy sets it),
    # else the one next to this Python (the venv's).
    proc = subprocess.run([sys.executable, CHECK, "--root", root], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def apply(root, path, old, new):
    full = os.path.join(root, path)
    with open(full, encoding="utf-8") as f:
        text = f.read()
    count = text.count(old)
    if count != 1:
        return f"expected the text to change once in {path}, found it {count} times"
    with open(full, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))
    return None


def one(src, mutation):
    name, path, old, new, section, phrase = mutation
    with tempfile.TemporaryDirectory(prefix="check-deploy-neg-") as tmp:
        root = os.path.join(tmp, "repo")
        copy_tree(src, root)
        err = apply(root, path, old, new)
        if err:
            return False, f"{name}: {err}"
        code, out = run_check(root)
        if code == 0:
            return False, f"{name}: check-deploy PASSED on the broken copy\n{out}"
        if f"FAIL  {section}" not in out or phrase not in out:
            return False, (f"{name}: failed, but not in section {section!r} with {phrase!r}:\n"
                           + out)
        return True, f"{name}: FAIL {section} as expected"


def main():
    src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", ".."))
    with tempfile.TemporaryDirectory(prefix="check-deploy-neg-") as tmp:
        root = os.path.join(tmp, "repo")
        copy_tree(src, root)
        code, out = run_check(root)
        if code != 0:
            print("the unmodified copy does not pass, so the mutations prove nothing:\n" + out)
            return 1
        print("unmodified copy: passes")
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for ok, message in pool.map(lambda m: one(src, m), MUTATIONS):
            print(("ok    " if ok else "WRONG ") + message)
            failures += not ok
    if failures:
        print(f"negative check: {failures} of {len(MUTATIONS)} broken copies not caught")
        return 1
    print(f"negative check: all {len(MUTATIONS)} broken copies caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
