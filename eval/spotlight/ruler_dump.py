#!/usr/bin/env python3
"""Dumps queries and keys of RULER-like prompts answered correctly, for dominant.py.

For each task, sample 0 of the generated samples in --data-dir (magicpig eval ruler writes them)
is written as its task text, the answer prefix and the references ("input\\nprefix ref1, ref2"),
without the chat template, and prefilled with exact attention by magicpig_dump_qk with queries at
the last --queries positions: the tokens of the answer, whose queries look the needles up. The
dump's length is the text's own token count (the model's tokenizer, tests/tokenizer/
hf_reference.py), so nothing is repeated; the engine's count is one more (a start token), so the
text's last token falls outside the dump. Dumps are numbered in task order (doc0000.qk, ...).

Usage: ruler_dump.py --out DIR --model GGUF [--tasks niah_multikey_3,niah_single_3,...]
                     [--length 4096] [--queries 16] [--data-dir eval/data]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkdata  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", default="niah_multikey_3,niah_single_3,niah_multivalue,cwe")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--data-dir", default="eval/data")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dump-tool", default="build/tests/accuracy/magicpig_dump_qk")
    args = ap.parse_args()
    tok = qkdata.model_tokenizer(args.model)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, task in enumerate(args.tasks.split(",")):
            path = os.path.join(args.data_dir, f"{task}_{args.length}_seed42.jsonl")
            if not os.path.exists(path):
                raise SystemExit(f"{path} missing: run `magicpig eval ruler --tasks {task} "
                                 f"--lengths {args.length}` first")
            with open(path) as f:
                s = json.loads(f.readline())
            text = f"{s['input']}\n{s['answer_prefix']} {', '.join(s['outputs'])}"
            n = len(tok.encode(text, add_special_tokens=False).ids)
            txt = os.path.join(tmp, "prompt.txt")
            with open(txt, "w", encoding="utf-8") as f:
                f.write(text)
            r = subprocess.run([args.dump_tool, "--out", os.path.join(args.out, f"doc{i:04d}.qk"),
                                "--model", args.model, "--text", txt, "--tokens", str(n),
                                "--queries", str(args.queries), "--threads", str(args.threads),
                                "--no-values"], check=True, stdout=subprocess.PIPE, text=True)
            print(f"{task}: {r.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
