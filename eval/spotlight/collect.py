#!/usr/bin/env python3
"""Dumps post-RoPE queries and keys of a model on a corpus of long documents, for train.py.

The corpus is read offline from this machine: Python standard-library modules (code) and the git
documentation shipped by Debian (/usr/share/doc/git: release notes and manuals, English prose).
Files are sorted by path and concatenated per kind until a document holds about 5 bytes per wanted
token, so every document fills --tokens without repetition; documents alternate between the two
kinds. Each document is prefilled with exact attention by magicpig_dump_qk (tests/accuracy), which
writes its keys at every position and its queries at the last --queries positions (format in
eval/qk_dump.h). Documents are numbered; train.py and retrieval.py take ranges of them, so the
held-out documents are simply higher numbers.

Usage: collect.py --out DIR [--model GGUF] [--docs 120] [--tokens 4096] [--queries 128]
                  [--dump-tool build/tests/accuracy/magicpig_dump_qk] [--threads 2]
"""

import argparse
import glob
import os
import subprocess
import sysconfig
import tempfile


def sources():
    code = sorted(p for p in glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"),
                                       recursive=True)
                  if "/test" not in p and "site-packages" not in p and os.path.getsize(p) > 4000)
    prose = sorted(p for p in glob.glob("/usr/share/doc/git/**/*.txt", recursive=True)
                   if os.path.getsize(p) > 2000)
    return code, prose


def documents(count, min_bytes):
    code, prose = sources()
    pools = [code, prose]
    cursor = [0, 0]
    docs = []
    for i in range(count):
        kind = i % 2
        pool = pools[kind]
        if not pool:
            raise SystemExit(f"no {'code' if kind == 0 else 'prose'} files found")
        text, used = [], 0
        while used < min_bytes:
            path = pool[cursor[kind] % len(pool)]
            cursor[kind] += 1
            with open(path, "rb") as f:
                chunk = f.read().decode("utf-8", errors="replace")
            text.append(chunk)
            used += len(chunk.encode("utf-8"))
        docs.append("\n\n".join(text))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--first", type=int, default=0, help="first document number to dump")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dump-tool", default="build/tests/accuracy/magicpig_dump_qk")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    docs = documents(args.docs, 5 * args.tokens)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.first, args.docs):
            out = os.path.join(args.out, f"doc{i:04d}.qk")
            if os.path.exists(out):
                continue
            text = os.path.join(tmp, "doc.txt")
            with open(text, "w", encoding="utf-8") as f:
                f.write(docs[i])
            r = subprocess.run([args.dump_tool, "--out", out + ".part", "--model", args.model, "--text",
                            text, "--tokens", str(args.tokens), "--queries", str(args.queries),
                            "--threads", str(args.threads), "--no-values"], check=True,
                           stdout=subprocess.PIPE, text=True)
            os.replace(out + ".part", out)
            print(r.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
