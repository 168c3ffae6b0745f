#!/usr/bin/env python3
"""Paired differences between two methods' RULER-like scores over the (task, sample) pairs both
have: the helper behind every "paired" number in docs/evaluation.md (method - method, setup B - A,
by sample range, per task, one SimHash seed against another).

Usage (from the repository root, with the venv's Python):
    paired.py ROWS SETUP METHOD ROWS SETUP METHOD --length 4096 [--task cwe] [--lo 0] [--hi 50]
prints the mean difference (first - second, score x100), its standard error and the pair count.
With no arguments it prints the three examples evaluation.md quotes.
"""
import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot import mean_and_se  # noqa: E402


@functools.lru_cache(maxsize=None)
def rows_of(path):
    """Every row of a rows file, read once per process (the examples pair one file many times)."""
    with open(path) as f:
        return tuple(json.loads(line) for line in f)


def scores(path, setup, method, length, task, lo, hi):
    rows = rows_of(path)
    return {(r["task"], r["index"]): 100 * r["score"] for r in rows
            if (r["length"], r["setup"], r["method"]) == (length, setup, method)
            and lo <= r["index"] < hi and task in (None, r["task"])}


def paired(a, b, length, task=None, lo=0, hi=50):
    """((mean, s.e.) of score(a) - score(b), pair count); a and b are (rows file, setup, method)."""
    sa, sb = (scores(*x, length, task, lo, hi) for x in (a, b))
    d = [sa[k] - sb[k] for k in sa if k in sb]
    return mean_and_se(d), len(d)


def examples():
    r, s = "eval/results/ruler_rows.jsonl", "eval/results/ruler_4k_B_lshseed99.jsonl"
    print("4K, magicpig(8,75), B - A, samples 28-49:",
          paired((r, "B", "magicpig(8,75)"), (r, "A", "magicpig(8,75)"), 4096, lo=28))
    print("4K B, magicpig(8,75), SimHash seed 99 - 1234, samples 0-15:",
          paired((s, "B", "magicpig(8,75)"), (r, "B", "magicpig(8,75)"), 4096, hi=16))
    for kl in ("(10,150)", "(9,120)", "(8,75)"):
        print(f"8K B, cwe, magicpig{kl} - topk@{kl}:",
              paired((r, "B", "magicpig" + kl), (r, "B", "topk@" + kl), 8192, "cwe"))


def main():
    if len(sys.argv) == 1:
        examples()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", nargs=3, metavar=("ROWS", "SETUP", "METHOD"))
    ap.add_argument("b", nargs=3, metavar=("ROWS", "SETUP", "METHOD"))
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--task", default=None)
    ap.add_argument("--lo", type=int, default=0)
    ap.add_argument("--hi", type=int, default=50)
    args = ap.parse_args()
    (mean, se), n = paired(tuple(args.a), tuple(args.b), args.length, args.task, args.lo, args.hi)
    print(f"{mean:+.2f} ± {se:.2f} over {n} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
