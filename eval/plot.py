#!/usr/bin/env python3
"""Plots for docs/evaluation.md from the outputs of `magicpig eval` (issue #6).

  .venv/bin/python eval/plot.py --ruler eval/results/ruler_rows.jsonl \
      --attn eval/results/attn_error_4k.json --ppl eval/results/ppl.json --out docs/img

- ruler rows (JSONL, one per task/length/index/setup/method) -> eval_ruler_<length>.png: the
  task-averaged score against the fraction of keys touched, per method and setup (only tasks that
  every plotted method of that setup has, so averages compare like with like).
- attn-error summary (JSON) -> eval_attn_error.png: relative L2 error against |S|/n per (K, L)
  for magicpig, oracle sampling and top-k at the same |S|.
- ppl (JSON) -> eval_ppl.png: KL(full || method) and top-1 agreement against the fraction of keys
  touched.
- --ppl-pool F...: ppl JSON files of the same prefix on different texts (--text-seed) -> a markdown
  table pooling them: per method the perplexity ratio to full as exp(mean over texts of the
  per-text mean NLL difference), with the spread of that difference across texts.
"""
import argparse
import collections
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"full": "black", "magicpig": "tab:red", "topk": "tab:blue", "oracle": "tab:green",
          "vattention": "tab:purple", "vattention-lsh": "tab:orange", "spotlight": "tab:cyan",
          "vattention-spotlight": "tab:brown", "sketch": "tab:olive",
          "vattention-sketch": "tab:pink"}
MARKERS = {"full": "s", "magicpig": "o", "topk": "^", "oracle": "D", "vattention": "P",
           "vattention-lsh": "X", "spotlight": "*", "vattention-spotlight": "v", "sketch": "h",
           "vattention-sketch": "p"}


def mean_and_se(xs):
    """The mean of xs and its standard error (nan for fewer than two values)."""
    mu = sum(xs) / len(xs)
    if len(xs) < 2:
        return mu, float("nan")
    return mu, math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def ruler(path, out_dir):
    """Accuracy vs keys touched, one PNG per length. Per setup one panel of the methods with the
    most rows (split_complete, the tables' rule), and, where an extension ran some methods on
    fewer samples, a second panel with every method on the (task, sample) pairs they all have."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_len = collections.defaultdict(list)
    for r in rows:
        by_len[r["length"]].append(r)
    written = []
    for length, rs in sorted(by_len.items()):
        panels = []  # (setup, per, fam, methods, subset?)
        for setup in sorted({r["setup"] for r in rs}):
            per = collections.defaultdict(dict)  # method -> {(task, index): (score, density)}
            fam = {}
            for r in rs:
                if r["setup"] != setup:
                    continue
                per[r["method"]][(r["task"], r["index"])] = (100 * r["score"], r["density"])
                fam[r["method"]] = r["family"]
            # Methods run on fewer tasks (leftovers of an interrupted, differently configured run)
            # are left out of both panels.
            n_tasks = {m: len({t for (t, _) in per[m]}) for m in fam}
            all_tasks = sorted(m for m in fam if n_tasks[m] == max(n_tasks.values()))
            complete, short = split_complete({m: len(per[m]) for m in all_tasks})
            panels.append((setup, per, fam, sorted(complete), False))
            if short:
                panels.append((setup, per, fam, all_tasks, True))
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
        for ax, (setup, per, fam, methods, subset) in zip(axes[0], panels):
            # Every point averages the (task, sample) pairs that all plotted methods have, so that
            # points compare like with like.
            pairs = set.intersection(*(set(per[m]) for m in methods))
            common = sorted({t for (t, _) in pairs})
            n_samples = min(sum(1 for (t, _) in pairs if t == task) for task in common)
            cell = collections.defaultdict(list)  # (method, task) -> scores on the common pairs
            dens = collections.defaultdict(list)
            for m in methods:
                for (t, i) in pairs:
                    cell[(m, t)].append(per[m][(t, i)][0])
                    dens[m].append(per[m][(t, i)][1])
            placed = []  # (density, avg) of the points labelled so far
            for m in methods:
                avg = sum(sum(cell[(m, t)]) / len(cell[(m, t)]) for t in common) / max(1, len(common))
                d = 100 * sum(dens[m]) / len(dens[m])
                f = fam[m]
                ax.scatter([d], [avg], color=COLORS[f], marker=MARKERS[f], s=50, zorder=3)
                # Points that (nearly) coincide, e.g. top-k and MagicPIG at the same keys and score,
                # get their labels stacked downwards instead of printed over each other.
                near = sum(1 for pd, pa in placed
                           if abs(math.log10(pd / d)) < 0.05 and abs(pa - avg) < 0.3)
                placed.append((d, avg))
                ax.annotate(m, (d, avg), textcoords="offset points", xytext=(6, 4 - 14 * near),
                            fontsize=7, rotation=0 if near else 30)
            ax.set_xscale("log")
            # Headroom so that the rotated labels of the top and right points stay inside the axes.
            ax.margins(x=0.12, y=0.15)
            ax.set_xlabel("keys touched / offloaded (%)")
            ax.set_ylabel(f"score, mean over {len(common)} tasks (>= {n_samples} samples each)")
            title = f"RULER-like {length // 1024}K, setup {setup}"
            ax.set_title(title + (f": all methods, {n_samples} samples" if subset else ""),
                         fontsize=10 if subset else None)
            ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        name = os.path.join(out_dir, f"eval_ruler_{length // 1024}k.png")
        fig.savefig(name, dpi=90)
        plt.close(fig)
        written.append(name)
    return written


def split_complete(counts):
    """Splits the methods of one (length, setup) by their row count (`counts`: method -> rows)
    into those with the most rows and the rest, which ran on fewer prompts (leftovers of an
    interrupted, differently configured run, or an extension stopped part-way) and would average
    other prompts than the complete ones."""
    most = max(counts.values())
    return ([m for m in counts if counts[m] == most], [m for m in counts if counts[m] < most])


def agreement(path):
    """Free-running greedy agreement with full attention (docs/evaluation.md), as a markdown table: the
    share of (task, sample) whose output equals full's, and the mean length of the common prefix
    in characters (outputs are compared as text; early-stopped outputs are prefixes)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    full = {(r["length"], r["setup"], r["task"], r["index"]): r["prediction"]
            for r in rows if r["family"] == "full"}
    agg = collections.defaultdict(list)
    for r in rows:
        key = (r["length"], r["setup"], r["task"], r["index"])
        if r["family"] == "full" or key not in full:
            continue
        a, b = full[key], r["prediction"]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        same = a == b or (n == min(len(a), len(b)) and r["stop"] == "all_found")
        agg[(r["length"], r["setup"], r["method"])].append((same, n, len(a)))
    print("| length | setup | method | samples | output = full | mean common prefix (chars) |")
    print("|---|---|---|---:|---:|---:|")
    counts = collections.defaultdict(dict)  # (length, setup) -> method -> rows
    for (length, setup, m), v in agg.items():
        counts[(length, setup)][m] = len(v)
    for (length, setup, m), v in sorted(agg.items()):
        if m in split_complete(counts[(length, setup)])[1]:
            continue
        print(f"| {length} | {setup} | {m} | {len(v)} | {sum(x[0] for x in v) / len(v):.0%} | "
              f"{sum(x[1] for x in v) / len(v):.0f} of {sum(x[2] for x in v) / len(v):.0f} |")


def tables(path):
    """The per-task tables of docs/evaluation.md (markdown), per length and setup: score x100
    (mean over samples), the task average, the mean gap to full over the same tasks with the
    standard error of the paired (task, sample) differences, density."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_sample = {(r["length"], r["setup"], r["method"], r["task"], r["index"]): 100 * r["score"]
                 for r in rows}
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["length"], r["setup"])].append(r)
    order = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1",
             "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt",
             "cwe", "fwe", "qa_1", "qa_2"]
    for (length, setup), rs in sorted(groups.items()):
        cell = collections.defaultdict(list)
        dens = collections.defaultdict(list)
        for r in rs:
            cell[(r["method"], r["task"])].append(100 * r["score"])
            dens[r["method"]].append(r["density"])
        # Methods run on fewer prompts are left out and named; their table comes from a rows
        # file filtered to the samples they have.
        n_rows = collections.Counter(r["method"] for r in rs)
        methods, short_runs = split_complete(n_rows)
        fam_order = {"full": 0, "magicpig": 1, "topk": 2, "oracle": 3, "vattention": 4,
                     "vattention-lsh": 5, "spotlight": 6, "vattention-spotlight": 7, "sketch": 8,
                     "vattention-sketch": 9}

        def sort_key(m):
            k = int(m.split("(")[1].split(",")[0]) if "(" in m else 99
            name = m.split("@")[0].split("(")[0]
            # spotlight-rerankR: after spotlight, by R; sketchR: by R
            rerank = int(name[len("spotlight-rerank"):]) if name.startswith("spotlight-rerank") else 0
            for fam in ("sketch", "vattention-sketch"):
                if name.startswith(fam) and name[len(fam):].isdigit():
                    name, rerank = fam, int(name[len(fam):])
            return (m != "full", -k, fam_order["spotlight" if name.startswith("spotlight") else name],
                    rerank)

        methods.sort(key=sort_key)
        tasks = [t for t in order if all((m, t) in cell for m in methods)]
        ns = [len(cell[("full", t)]) for t in tasks]
        print(f"\n{length // 1024}K, setup {setup} — samples per task: "
              + ", ".join(f"{t} {n}" for t, n in zip(tasks, ns)) + "\n")
        if short_runs:
            print("(left out, run on fewer samples: "
                  + ", ".join(f"{m} {n_rows[m]} rows" for m in short_runs) + ")\n")
        short = [t.replace("niah_", "").replace("multikey", "mk").replace("single", "s")
                 .replace("multivalue", "mv").replace("multiquery", "mq") for t in tasks]
        print("| method | " + " | ".join(short) + " | **avg** | gap to full | keys touched |")
        print("|---|" + "---:|" * (len(tasks) + 3))
        full = {t: sum(cell[("full", t)]) / len(cell[("full", t)]) for t in tasks}
        for m in methods:
            means = [sum(cell[(m, t)]) / len(cell[(m, t)]) for t in tasks]
            avg = sum(means) / len(means)
            gap = sum(x - full[t] for x, t in zip(means, tasks)) / len(tasks)
            d = 100 * sum(dens[m]) / len(dens[m])
            # Paired differences to full, sample by sample (same task, same index).
            diffs = [100 * r["score"] - by_sample[(length, setup, "full", r["task"], r["index"])]
                     for r in rs if r["method"] == m and r["task"] in tasks
                     and (length, setup, "full", r["task"], r["index"]) in by_sample]
            se = ""
            if m != "full" and len(diffs) > 1:
                se = f" ± {mean_and_se(diffs)[1]:.1f}"
            print(f"| {m} | " + " | ".join(f"{x:.0f}" for x in means)
                  + f" | **{avg:.1f}** | {gap:+.1f}{se} | {d:.2f}% |")


def attn(path, out_dir):
    data = json.load(open(path))
    cfgs = sorted(data["configs"], key=lambda c: c["sampled_frac"])
    xs = [100 * c["sampled_frac"] for c in cfgs]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for m in ("magicpig", "oracle", "topk"):
        ax.plot(xs, [c[m]["mean"] for c in cfgs], marker=MARKERS[m], color=COLORS[m],
                label=f"{m} (mean)")
        ax.plot(xs, [c[m]["p90"] for c in cfgs], marker=MARKERS[m], color=COLORS[m],
                linestyle=":", alpha=0.6, label=f"{m} (p90)")
    for x, c in zip(xs, cfgs):
        ax.annotate(f"({c['k']},{c['l']})", (x, c["magicpig"]["mean"]), textcoords="offset points",
                    xytext=(4, -10), fontsize=7)
    ax.set_xlabel("budget |S| / n_off (%), matched per query")
    ax.set_ylabel("relative L2 error of the attention output")
    ax.set_title(f"SmolLM2 real activations, {data['tokens']} tokens")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = os.path.join(out_dir, "eval_attn_error.png")
    fig.savefig(name, dpi=90)
    plt.close(fig)
    return [name]


def ppl(paths, out_dir):
    datas = [json.load(open(p)) for p in paths]
    data = datas[0]
    rows = [r for d in datas for r in d["rows"]]
    prefixes = sorted({r["prefix"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for p in prefixes:
        agg = collections.defaultdict(list)
        for r in rows:
            if r["prefix"] == p and r["family"] != "full":
                agg[(r["method"], r["family"])].append(r)
        for (m, f), rs in sorted(agg.items()):
            d = 100 * sum(r["density"] for r in rs) / len(rs)
            kl = sum(r["kl"] for r in rs) / len(rs)
            t1 = sum(r["top1"] for r in rs) / len(rs)
            axes[0].scatter([d], [kl], color=COLORS[f], marker=MARKERS[f])
            axes[0].annotate(f"{m} P={p}", (d, kl), textcoords="offset points", xytext=(3, 3),
                             fontsize=6)
            axes[1].scatter([d], [100 * t1], color=COLORS[f], marker=MARKERS[f])
            axes[1].annotate(f"{m} P={p}", (d, 100 * t1), textcoords="offset points",
                             xytext=(3, 3), fontsize=6)
    axes[0].set_ylabel("mean KL(full || method), nats")
    axes[1].set_ylabel("top-1 agreement with full (%)")
    for ax in axes:
        ax.set_xlabel("keys touched / offloaded (%)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"teacher-forced decode, {data['steps']} steps after an exact prefix")
    fig.tight_layout()
    name = os.path.join(out_dir, "eval_ppl.png")
    fig.savefig(name, dpi=90)
    plt.close(fig)
    return [name]


def ppl_pool(paths):
    """Prints one markdown table per prefix over several texts' ppl JSON files."""
    per = collections.defaultdict(lambda: collections.defaultdict(list))  # (prefix, method) -> text
    for path in paths:
        d = json.load(open(path))
        for r in d["rows"]:
            per[(r["prefix"], r["method"])][d["text_seed"]].append(r)
    for prefix in sorted({p for p, _ in per}):
        full = per[(prefix, "full")]
        texts = sorted(full)
        print(f"P = {prefix}, texts {', '.join(str(t) for t in texts)} "
              f"({sum(full[t][0]['positions'] for t in texts)} positions in all):\n")
        print("| method | texts x runs | ppl / full (pooled) | per-text ppl / full, min - max "
              "| mean NLL diff +- s.e. (nats) | KL(full \u2016 m) | top-1 agreement | keys touched |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        methods = sorted((m for p, m in per if p == prefix),
                         key=lambda m: (m != "full", m.split("(")[-1], m))
        for m in methods:
            by_text = per[(prefix, m)]
            if sorted(by_text) != texts:
                continue
            diffs = []
            rows = []
            for t in texts:
                rs = by_text[t]
                rows += rs
                diffs.append(sum(r["nll"] for r in rs) / len(rs) - full[t][0]["nll"])
            mean, se = mean_and_se(diffs)
            kl = sum(r["kl"] for r in rows) / len(rows)
            t1 = sum(r["top1"] for r in rows) / len(rows)
            dens = sum(r["density"] for r in rows) / len(rows)
            runs = len(rows) // len(texts)
            print(f"| {m} | {len(texts)} x {runs} | {math.exp(mean):.4f} | "
                  f"{math.exp(min(diffs)):.4f} - {math.exp(max(diffs)):.4f} | "
                  f"{mean:+.4f} +- {se:.4f} | {kl:.4f} | {100 * t1:.1f}% | {100 * dens:.2f}% |")
        print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ruler", help="ruler rows JSONL")
    ap.add_argument("--attn", help="attn-error summary JSON")
    ap.add_argument("--ppl", nargs="+", help="ppl JSON file(s)")
    ap.add_argument("--ppl-pool", nargs="+", help="ppl JSON files of different texts to pool")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--tables", action="store_true",
                    help="print the per-task score tables of --ruler (markdown)")
    ap.add_argument("--agreement", action="store_true",
                    help="print the agreement-with-full table of --ruler (markdown)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    written = []
    if a.ruler:
        written += ruler(a.ruler, a.out)
        if a.agreement:
            agreement(a.ruler)
        if a.tables:
            tables(a.ruler)
    if a.attn:
        written += attn(a.attn, a.out)
    if a.ppl:
        written += ppl(a.ppl, a.out)
    if a.ppl_pool:
        ppl_pool(a.ppl_pool)
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
