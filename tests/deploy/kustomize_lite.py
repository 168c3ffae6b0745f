"""A small Kustomize renderer for the subset deploy/ uses, so that the manifests can be rendered and
validated offline without kubectl (PyPI `kustomize` 0.6.0 only generates kustomization files).

Supported kustomization fields: apiVersion, kind, namespace, resources (files and kustomization
folders), configMapGenerator (files, envs, literals, options, behavior create|merge|replace),
generatorOptions, patches (strategic merge or JSON 6902, from path or inline, optional target) and
images. Anything else is an error, never silently ignored. Generated ConfigMaps get Kustomize's
name hash (same algorithm, so the output equals `kubectl kustomize`, which check_deploy.py compares
when kubectl is installed) and references to them in pod templates are renamed.
"""

import copy
import hashlib
import json
import os

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
ALLOWED_FIELDS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator",
                  "generatorOptions", "patches", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass", "RuntimeClass",
                  "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
# Strategic-merge keys of the lists our patches touch (Kubernetes' patchMergeKey).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "envFrom": None, "volumeMounts": "mountPath", "imagePullSecrets": "name"}

# Internal bookkeeping keys on generated ConfigMaps; removed before output.
_ORIG = "__kustomize_lite_orig_name"
_HASH = "__kustomize_lite_needs_hash"


class KustomizeError(Exception):
    pass


def find_kustomization(folder):
    for name in KUSTOMIZATION_FILES:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def _inside(root, path):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def _load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _go_json(obj):
    """json.Marshal as Go does it: sorted keys, no spaces, HTML characters escaped."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def configmap_hash(cm):
    """Kustomize's name suffix (api/hasher). Its encoder looks up "metadata/name" as one field
    name, which never exists, so the name part of the hashed JSON is always empty."""
    m = {"kind": "ConfigMap", "name": "", "data": cm.get("data") or {}}
    if cm.get("binaryData"):
        m["binaryData"] = cm["binaryData"]
    digest = hashlib.sha256(_go_json(m).encode("utf-8")).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _parse_env_file(path):
    data = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise KustomizeError(f"{path}:{lineno}: expected KEY=VALUE, got {line!r}")
            key, value = line.split("=", 1)
            data[key] = value
    return data


def _generate_configmap(root, spec, options):
    unknown = set(spec) - {"name", "namespace", "behavior", "files", "envs", "literals", "options"}
    if unknown:
        raise KustomizeError(f"{root}: configMapGenerator fields not supported: {sorted(unknown)}")
    data = {}
    for env in spec.get("envs", []):
        path = os.path.join(root, env)
        if not _inside(root, path):
            raise KustomizeError(f"{root}: security; file {env} is not in or below {root}")
        data.update(_parse_env_file(path))
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for entry in spec.get("files", []):
        key, sep, rel = entry.partition("=")
        if not sep:
            key, rel = os.path.basename(entry), entry
        path = os.path.join(root, rel)
        if not _inside(root, path):
            raise KustomizeError(f"{root}: security; file {rel} is not in or below {root}")
        with open(path, encoding="utf-8") as f:
            data[key] = f.read()
    opts = dict(options or {})
    opts.update(spec.get("options") or {})
    unknown = set(opts) - {"labels", "annotations", "disableNameSuffixHash"}
    if unknown:
        raise KustomizeError(f"{root}: generator options not supported: {sorted(unknown)}")
    meta = {"name": spec["name"]}
    if spec.get("namespace"):
        meta["namespace"] = spec["namespace"]
    if opts.get("labels"):
        meta["labels"] = dict(opts["labels"])
    if opts.get("annotations"):
        meta["annotations"] = dict(opts["annotations"])
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data,
          _ORIG: spec["name"], _HASH: not opts.get("disableNameSuffixHash", False)}
    return cm, spec.get("behavior", "create")


def _strategic_merge(base, patch):
    for key, value in patch.items():
        if key == "$patch":
            continue
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            directive = value.get("$patch")
            if directive == "delete":
                base.pop(key, None)
            elif directive == "replace":
                base[key] = {k: copy.deepcopy(v) for k, v in value.items() if k != "$patch"}
            else:
                _strategic_merge(base[key], value)
        elif (isinstance(value, list) and isinstance(base.get(key), list)
              and MERGE_KEYS.get(key)):
            merge_key = MERGE_KEYS[key]
            for item in value:
                match = next((b for b in base[key]
                              if isinstance(b, dict) and b.get(merge_key) == item.get(merge_key)),
                             None)
                if item.get("$patch") == "delete":
                    if match is not None:
                        base[key].remove(match)
                elif match is not None:
                    _strategic_merge(match, item)
                else:
                    base[key].append(copy.deepcopy(item))
        else:
            base[key] = copy.deepcopy(value)


def _pointer(path):
    if not path.startswith("/"):
        raise KustomizeError(f"JSON patch path must start with '/': {path}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(obj, ops):
    for op in ops:
        parts = _pointer(op["path"])
        parent = obj
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise KustomizeError(f"JSON patch op not supported: {kind}")
        else:
            if kind in ("add", "replace"):
                if kind == "replace" and last not in parent:
                    raise KustomizeError(f"JSON patch replace of missing {op['path']}")
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                if last not in parent:
                    raise KustomizeError(f"JSON patch remove of missing {op['path']}")
                del parent[last]
            else:
                raise KustomizeError(f"JSON patch op not supported: {kind}")


def _matches(res, target):
    unknown = set(target) - {"kind", "name", "namespace", "group", "version"}
    if unknown:
        raise KustomizeError(f"patch target fields not supported: {sorted(unknown)}")
    group, _, version = res.get("apiVersion", "").rpartition("/")
    return all([
        target.get("kind") in (None, res.get("kind")),
        target.get("name") in (None, res["metadata"].get("name")),
        target.get("namespace") in (None, res["metadata"].get("namespace")),
        target.get("group") in (None, group),
        target.get("version") in (None, version),
    ])


def _apply_patch(root, resources, entry):
    unknown = set(entry) - {"path", "patch", "target", "options"}
    if unknown:
        raise KustomizeError(f"{root}: patch fields not supported: {sorted(unknown)}")
    if "path" in entry:
        path = os.path.join(root, entry["path"])
        if not _inside(root, path):
            raise KustomizeError(
                f"{root}: security; file {entry['path']} is not in or below {root}")
        with open(path, encoding="utf-8") as f:
            text = f.read()
    else:
        text = entry["patch"]
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    target = entry.get("target")
    if len(docs) == 1 and isinstance(docs[0], list):  # JSON 6902
        if not target:
            raise KustomizeError(f"{root}: a JSON 6902 patch needs a target")
        hits = [r for r in resources if _matches(r, target)]
        if not hits:
            raise KustomizeError(f"{root}: no resource matches patch target {target}")
        for r in hits:
            _json_patch(r, docs[0])
        return
    for doc in docs:
        if target:
            hits = [r for r in resources if _matches(r, target)]
        else:
            hits = [r for r in resources
                    if r.get("kind") == doc.get("kind")
                    and r["metadata"].get("name") == doc.get("metadata", {}).get("name")]
        if not hits:
            raise KustomizeError(
                f"{root}: patch matches no resource: {doc.get('kind')}/"
                f"{doc.get('metadata', {}).get('name')} (target {target})")
        for r in hits:
            patch = copy.deepcopy(doc)
            if target:  # the patch's own identity does not rename the targets
                patch.pop("metadata", None)
                patch.pop("kind", None)
                patch.pop("apiVersion", None)
            _strategic_merge(r, patch)


def pod_specs(res):
    """The pod specs inside a workload resource (empty for other kinds)."""
    kind = res.get("kind")
    if kind in POD_TEMPLATE_KINDS:
        return [res["spec"]["template"]["spec"]]
    if kind == "CronJob":
        return [res["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if kind == "Pod":
        return [res["spec"]]
    return []


def _containers(spec):
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _split_image(image):
    digest = None
    if "@" in image:
        image, digest = image.split("@", 1)
    name, tag = image, None
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        name, tag = image[:colon], image[colon + 1:]
    return name, tag, digest


def _apply_images(root, resources, images):
    for img in images:
        unknown = set(img) - {"name", "newName", "newTag", "digest"}
        if unknown:
            raise KustomizeError(f"{root}: images fields not supported: {sorted(unknown)}")
        for res in resources:
            for spec in pod_specs(res):
                for c in _containers(spec):
                    name, tag, digest = _split_image(c.get("image", ""))
                    if name != img["name"]:
                        continue
                    name = img.get("newName", name)
                    if "digest" in img:
                        c["image"] = f"{name}@{img['digest']}"
                    elif "newTag" in img:
                        c["image"] = f"{name}:{img['newTag']}"
                    else:
                        c["image"] = (name + (f":{tag}" if tag else "")
                                      + (f"@{digest}" if digest else ""))


def _build(folder):
    kfile = find_kustomization(folder)
    if kfile is None:
        raise KustomizeError(f"{folder}: no kustomization.yaml")
    with open(kfile, encoding="utf-8") as f:
        k = yaml.safe_load(f) or {}
    unknown = set(k) - ALLOWED_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: fields not supported by kustomize_lite: {sorted(unknown)}")
    if k.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{kfile}: kind {k.get('kind')} not supported")
    resources = []
    for entry in k.get("resources") or []:
        path = os.path.normpath(os.path.join(folder, entry))
        if os.path.isdir(path):
            resources.extend(_build(path))
        elif os.path.isfile(path):
            if not _inside(folder, path):
                raise KustomizeError(f"{kfile}: security; file {entry} is not in or below {folder}")
            for doc in _load_docs(path):
                if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
                    raise KustomizeError(f"{path}: not a Kubernetes object")
                resources.append(doc)
        else:
            raise KustomizeError(f"{kfile}: resource {entry} does not exist")
    options = k.get("generatorOptions") or {}
    for spec in k.get("configMapGenerator") or []:
        cm, behavior = _generate_configmap(folder, spec, options)
        existing = [r for r in resources if r.get("kind") == "ConfigMap"
                    and r.get(_ORIG, r["metadata"]["name"]) == spec["name"]]
        if behavior == "create":
            if existing:
                raise KustomizeError(f"{kfile}: ConfigMap {spec['name']} already exists")
            resources.append(cm)
        elif behavior in ("merge", "replace"):
            if not existing:
                raise KustomizeError(f"{kfile}: no ConfigMap {spec['name']} to {behavior}")
            old = existing[0]
            if behavior == "merge":
                old.setdefault("data", {}).update(cm["data"])
                for field in ("labels", "annotations"):
                    if cm["metadata"].get(field):
                        old["metadata"].setdefault(field, {}).update(cm["metadata"][field])
            else:
                old["data"] = cm["data"]
        else:
            raise KustomizeError(f"{kfile}: behavior {behavior} not supported")
    for entry in k.get("patches") or []:
        _apply_patch(folder, resources, entry)
    _apply_images(folder, resources, k.get("images") or [])
    if k.get("namespace"):
        for r in resources:
            if r.get("kind") not in CLUSTER_SCOPED:
                r["metadata"]["namespace"] = k["namespace"]
    return resources


def _fix_references(resources):
    renamed = {}
    for r in resources:
        if r.get("kind") == "ConfigMap" and _ORIG in r:
            if r.pop(_HASH):
                r["metadata"]["name"] = f"{r[_ORIG]}-{configmap_hash(r)}"
            renamed[(r["metadata"].get("namespace"), r.pop(_ORIG))] = r["metadata"]["name"]

    def new_name(ns, name):
        return renamed.get((ns, name), name)

    for r in resources:
        ns = r["metadata"].get("namespace")
        for spec in pod_specs(r):
            for vol in spec.get("volumes") or []:
                if "configMap" in vol:
                    vol["configMap"]["name"] = new_name(ns, vol["configMap"]["name"])
                for src in (vol.get("projected") or {}).get("sources") or []:
                    if "configMap" in src:
                        src["configMap"]["name"] = new_name(ns, src["configMap"]["name"])
            for c in _containers(spec):
                for ef in c.get("envFrom") or []:
                    if "configMapRef" in ef:
                        ef["configMapRef"]["name"] = new_name(ns, ef["configMapRef"]["name"])
                for ev in c.get("env") or []:
                    ref = (ev.get("valueFrom") or {}).get("configMapKeyRef")
                    if ref:
                        ref["name"] = new_name(ns, ref["name"])


def render(folder):
    """Renders the kustomization in `folder`; returns the list of objects (plain dicts)."""
    resources = _build(os.path.abspath(folder))
    _fix_references(resources)
    return resources
