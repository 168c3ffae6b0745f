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
"""
import argparse
import collections
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"full": "black", "magicpig": "tab:red", "topk": "tab:blue", "oracle": "tab:green"}
MARKERS = {"full": "s", "magicpig": "o", "topk": "^", "oracle": "D"}


def ruler(path, out_dir):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_len = collections.defaultdict(list)
    for r in rows:
        by_len[r["length"]].append(r)
    written = []
    for length, rs in sorted(by_len.items()):
        setups = sorted({r["setup"] for r in rs})
        fig, axes = plt.subplots(1, len(setups), figsize=(5.2 * len(setups), 4), squeeze=False)
        for ax, setup in zip(axes[0], setups):
            cell = collections.defaultdict(list)  # (method, task) -> scores
            dens = collections.defaultdict(list)
            fam = {}
            for r in rs:
                if r["setup"] != setup:
                    continue
                cell[(r["method"], r["task"])].append(100 * r["score"])
                dens[r["method"]].append(r["density"])
                fam[r["method"]] = r["family"]
            methods = sorted(fam)
            tasks = sorted({t for (_, t) in cell})
            common = [t for t in tasks if all((m, t) in cell for m in methods)]
            for m in methods:
                avg = sum(sum(cell[(m, t)]) / len(cell[(m, t)]) for t in common) / max(1, len(common))
                d = 100 * sum(dens[m]) / len(dens[m])
                f = fam[m]
                ax.scatter([d], [avg], color=COLORS[f], marker=MARKERS[f], s=50, zorder=3)
                ax.annotate(m, (d, avg), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.set_xscale("log")
            ax.set_xlabel("keys touched / offloaded (%)")
            ax.set_ylabel(f"score, mean over {len(common)} tasks")
            ax.set_title(f"RULER-like {length // 1024}K, setup {setup}")
            ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        name = os.path.join(out_dir, f"eval_ruler_{length // 1024}k.png")
        fig.savefig(name, dpi=90)
        plt.close(fig)
        written.append(name)
    return written


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


def ppl(path, out_dir):
    data = json.load(open(path))
    rows = data["rows"]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ruler", help="ruler rows JSONL")
    ap.add_argument("--attn", help="attn-error summary JSON")
    ap.add_argument("--ppl", help="ppl JSON")
    ap.add_argument("--out", default="docs/img")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    written = []
    if a.ruler:
        written += ruler(a.ruler, a.out)
    if a.attn:
        written += attn(a.attn, a.out)
    if a.ppl:
        written += ppl(a.ppl, a.out)
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
