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

--kind retrieval writes documents with the structure of a lookup instead: the same code or prose
(taken from the other end of the file lists), with 24 short records planted at random line
boundaries ("The vault combination recorded for Telvara Dunmoke is 4471920.", in six phrasings of
our own, invented names, 4-7 digit numbers or 8 hex digits), then a tail of questions about them,
each followed by its answer ("Q: ... A: 4471920"). The document is sized with the model's own
tokenizer (tests/tokenizer/hf_reference.py) so that the last --queries dumped positions all fall in
the tail: their queries are the ones that look a planted record up, the dominant-key structure of
retrieval prompts, which the code and prose alone rarely show.

Usage: collect.py --out DIR [--model GGUF] [--docs 120] [--first 0] [--tokens 4096]
                  [--queries 128] [--kind corpus|retrieval] [--seed 5]
                  [--dump-tool build/tests/accuracy/magicpig_dump_qk] [--threads 2]
"""

import argparse
import glob
import os
import random
import subprocess
import sys
import sysconfig
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qkdata  # noqa: E402


def sources():
    code = sorted(p for p in glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"),
                                       recursive=True)
                  if "/test" not in p and "site-packages" not in p and os.path.getsize(p) > 4000)
    prose = sorted(p for p in glob.glob("/usr/share/doc/git/**/*.txt", recursive=True)
                   if os.path.getsize(p) > 2000)
    return code, prose


def documents(count, min_bytes):
    return documents_from(list(sources()), count, min_bytes)


def documents_from(pools, count, min_bytes):
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


SYLLABLES = ["ba", "del", "fa", "gor", "hin", "ka", "lum", "mor", "ne", "pol", "quin", "ra",
             "sel", "tor", "va", "wen", "xi", "yal", "zu", "bri", "cas", "dun", "mok", "tel"]
# (record, question, answer prefix); {n} is a name, {v} the value.
RECORDS = [
    ("Ledger line: {n} holds ticket {v}.", "Which ticket does {n} hold?", "Ticket"),
    ("The vault combination recorded for {n} is {v}.", "What is the vault combination for {n}?",
     "Combination"),
    ("Memo: the badge issued to {n} reads {v}.", "What does the badge issued to {n} read?", "Badge"),
    ("{n} was assigned locker {v} this season.", "Which locker was {n} assigned?", "Locker"),
    ("Note for the archive: {n} filed report {v}.", "Which report did {n} file?", "Report"),
    ("Contact {n} on extension {v}.", "On which extension can {n} be reached?", "Extension"),
]


def invented_name(rng):
    word = lambda: "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))  # noqa: E731
    return f"{word().capitalize()} {word().capitalize()}"


def invented_value(rng):
    if rng.random() < 0.25:
        return "".join(rng.choice("0123456789abcdef") for _ in range(8))
    return str(rng.randint(1000, 9999999))


def retrieval_document(tok, haystack, tokens, queries, rng, n_records=24):
    """Haystack text with planted records and a question tail, sized by `tok` so that the first
    `tokens` tokens end inside the tail with at least `queries` tail tokens before the cut."""
    records = []
    names = set()
    while len(records) < n_records:
        name = invented_name(rng)
        if name in names:
            continue
        names.add(name)
        records.append((rng.randrange(len(RECORDS)), name, invented_value(rng)))
    asked = records[:]
    rng.shuffle(asked)
    tail = "\n\nQuestions about the records above, each answered from them:\n" + "".join(
        f"Q: {RECORDS[k][1].format(n=n)}\nA: {RECORDS[k][2]} {v}.\n" for k, n, v in asked)
    planted = [RECORDS[k][0].format(n=n, v=v) for k, n, v in records]
    tail_tokens = len(tok.encode(tail, add_special_tokens=False).ids)
    if tail_tokens < queries + 96:
        raise SystemExit(f"the question tail is {tail_tokens} tokens; --queries {queries} needs more")
    # The body (haystack + records) ends 64 tokens before the dumped queries start.
    budget = tokens - queries - 64
    record_tokens = sum(len(tok.encode("\n" + r, add_special_tokens=False).ids) for r in planted)
    ids = tok.encode(haystack, add_special_tokens=False).ids
    cut = budget - record_tokens
    while True:
        lines = tok.decode(ids[:cut]).split("\n")
        slots = sorted(rng.randrange(1, len(lines)) for _ in planted)
        for r, at in sorted(zip(planted, slots), key=lambda p: -p[1]):
            lines.insert(at, r)
        body = "\n".join(lines)
        n_body = len(tok.encode(body, add_special_tokens=False).ids)
        if n_body <= budget:
            break
        cut -= n_body - budget
    text = body + tail
    total = len(tok.encode(text, add_special_tokens=False).ids)
    if total < tokens:
        raise SystemExit(f"retrieval document of {total} tokens is shorter than --tokens {tokens}")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--first", type=int, default=0, help="first document number to dump")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kind", choices=["corpus", "retrieval"], default="corpus")
    ap.add_argument("--seed", type=int, default=5, help="records of --kind retrieval")
    ap.add_argument("--dump-tool", default="build/tests/accuracy/magicpig_dump_qk")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.kind == "corpus":
        docs = documents(args.docs, 5 * args.tokens)
    else:
        tok = qkdata.model_tokenizer(args.model)
        code, prose = sources()
        # Haystacks from the other end of the file lists than the corpus documents.
        hay = documents_from([code[::-1], prose[::-1]], args.docs, 5 * args.tokens)
        docs = [None] * args.docs
        for i in range(args.first, args.docs):
            rng = random.Random(args.seed * 1000003 + i)
            docs[i] = retrieval_document(tok, hay[i], args.tokens, args.queries, rng)
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
