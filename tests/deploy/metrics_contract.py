"""The metric contract in docs/metrics.md, and checks of PromQL text against it.

`load(path)` parses the tables (one row per metric: `name` | type | `labels` | meaning) into
{name: Metric}. `check_expr(contract, expr)` returns the problems of one PromQL expression: a
`magicpig_*` name not in the contract, a `_bucket`/`_sum`/`_count` suffix on a non-histogram, a bare
histogram name, rate()/increase() of a gauge, a label the metric does not carry, and a
histogram_quantile over buckets aggregated without `le`. The C++ side can reuse `load` to compare
what the running nodes export with the contract.
"""

import dataclasses
import re

TYPES = ("counter", "gauge", "histogram")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus adds when scraping (deploy/prometheus/*.yml, ServiceMonitor), plus the
# `__name__` of the metric itself.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint",
                           "container", "__name__"})
NAME_RE = re.compile(r"\bmagicpig_[A-Za-z0-9_]+")


@dataclasses.dataclass
class Metric:
    name: str
    type: str
    labels: frozenset
    node_kinds: set


def load(path):
    contract = {}
    kind = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("## "):
                kind = line[3:].strip()
                continue
            if not line.startswith("| `magicpig_"):
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) != 4:
                raise ValueError(f"{path}:{lineno}: expected 4 cells, got {len(cells)}")
            name = cells[0].strip("`")
            mtype = cells[1]
            if mtype not in TYPES:
                raise ValueError(f"{path}:{lineno}: {name}: type {mtype!r} not one of {TYPES}")
            labels = frozenset(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[2]))
            if not labels and cells[2] not in ("—", "-", ""):
                raise ValueError(f"{path}:{lineno}: {name}: labels cell {cells[2]!r}")
            if mtype == "counter" and not name.endswith("_total"):
                raise ValueError(f"{path}:{lineno}: counter {name} must end in _total")
            if mtype != "counter" and name.endswith("_total"):
                raise ValueError(f"{path}:{lineno}: {name} ends in _total but is a {mtype}")
            if name in contract:
                old = contract[name]
                if (old.type, old.labels) != (mtype, labels):
                    raise ValueError(f"{path}:{lineno}: {name} listed twice with different "
                                     "type or labels")
                old.node_kinds.add(kind)
            else:
                contract[name] = Metric(name, mtype, labels, {kind})
    if not contract:
        raise ValueError(f"{path}: no metric rows found")
    return contract


def resolve(contract, token):
    """(metric, suffix) for a series name, or (None, None) when it is not in the contract."""
    if token in contract:
        return contract[token], ""
    for suffix in HISTOGRAM_SUFFIXES:
        if token.endswith(suffix) and token[: -len(suffix)] in contract:
            return contract[token[: -len(suffix)]], suffix
    return None, None


def _label_matchers(text):
    return re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", text)


def check_expr(contract, expr):
    """Problems (strings) of one PromQL expression."""
    problems = []
    used = []
    for m in NAME_RE.finditer(expr):
        token = m.group(0)
        metric, suffix = resolve(contract, token)
        if metric is None:
            problems.append(f"{token} is not in docs/metrics.md")
            continue
        if suffix and metric.type != "histogram":
            problems.append(f"{token}: {metric.name} is a {metric.type}, not a histogram")
        if not suffix and metric.type == "histogram":
            problems.append(f"{token} is a histogram: use {token}_bucket, _sum or _count")
        allowed = set(metric.labels) | TARGET_LABELS | ({"le"} if suffix == "_bucket" else set())
        used.append((token, metric, suffix, allowed))
        rest = expr[m.end():]
        if rest.startswith("{"):
            selector = rest[: rest.find("}") + 1]
            for label in _label_matchers(selector):
                if label not in allowed:
                    problems.append(f"{token}{{{label}=...}}: {metric.name} has no label {label}")
    for fn, token in re.findall(r"\b(rate|irate|increase)\s*\(\s*(magicpig_[A-Za-z0-9_]+)", expr):
        metric, suffix = resolve(contract, token)
        if metric is not None and metric.type == "gauge":
            problems.append(f"{fn}({token}): {token} is a gauge")
    all_labels = set().union(*(u[3] for u in used)) if used else set(TARGET_LABELS)
    for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in [x.strip() for x in clause.split(",") if x.strip()]:
            if label not in all_labels:
                problems.append(f"grouping by {label}: no metric in the expression has it")
    for clause, token in re.findall(
            r"histogram_quantile\s*\(\s*[0-9.]+\s*,\s*\w+\s+by\s*\(([^)]*)\)\s*\(\s*"
            r"(?:rate|irate|increase)\s*\(\s*(magicpig_[A-Za-z0-9_]+)", expr):
        if "le" not in [x.strip() for x in clause.split(",")]:
            problems.append(f"histogram_quantile over {token} aggregated without le")
    return problems


def legend_labels(legend):
    return re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend or "")


def labels_of_expr(contract, expr):
    """Every label a series selected by `expr` can carry (metric labels + target labels)."""
    labels = set(TARGET_LABELS)
    for m in NAME_RE.finditer(expr):
        metric, suffix = resolve(contract, m.group(0))
        if metric is not None:
            labels |= set(metric.labels)
            if suffix == "_bucket":
                labels.add("le")
    return labels
