#!/usr/bin/env python3
"""Generates the tokenizer conformance corpus: varied documents as JSON lines, deterministic per seed.

Mixes Python standard-library source (code, read offline from this interpreter's stdlib), prose
built from docstrings and word lists, text in many scripts (CJK, Arabic/Hebrew RTL, Indic, Thai,
Hangul, Cyrillic, Greek), emoji with ZWJ sequences and modifiers, combining marks, numbers of all
lengths and formats, whitespace runs (tabs, CR LF, Unicode spaces), control characters and the
model's special-token texts. Only assigned, non-surrogate code points are used so the text is
valid UTF-8 for both tokenizers.

Usage: make_corpus.py --out corpus.jsonl [--bin corpus.bin] [--seed 1234] [--min-bytes 307200]
The .bin form is the same documents as "<byte length>\\n<bytes>\\n" records for the C++ reader.
"""

import argparse
import json
import os
import random
import sysconfig
import unicodedata

SCRIPT_RANGES = [
    (0x0041, 0x007A), (0x00C0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0530, 0x058F),
    (0x0590, 0x05FF), (0x0600, 0x06FF), (0x0900, 0x097F), (0x0980, 0x09FF), (0x0B80, 0x0BFF),
    (0x0E00, 0x0E7F), (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x3040, 0x30FF),
    (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF01, 0xFF5E), (0x2000, 0x206F), (0x2190, 0x22FF),
    (0x2460, 0x24FF), (0x2150, 0x218F), (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF),
]
EMOJI = ["😀", "🙂", "🎉", "🚀", "❤️", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "🏳️‍🌈", "✨", "🤖", "🧪", "☕"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t", "\u00a0", "\u2003", "\u3000",
          "\u2009", "\u202f", "\u205f", "\u1680", "\u0085", "\u2028", "\u000b", "\u000c", "    "]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<|im_start", "im_end|>",
            "<jupyter_code>", "<repo_name>"]
WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an "
         "they which one you were her all she there would their we him been has when who will more "
         "no if out so said what up its about into than them can only other new some could time "
         "these two may then do first any my now such like our over man me even most made after "
         "also did many before must through back years where much your way well down should "
         "because each just those people how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while "
         "last might us great old year off come since against go came right used take three "
         "Paris London Tokyo capital France Germany Hugging Face tokenizer model inference").split()
CONTRACTIONS = ["don't", "I'll", "we've", "she's", "they're", "I'm", "you'd", "IT'S", "WE'LL",
                "O'Brien", "rock'n'roll", "'quoted'", "can't", "won't", "y'all"]
COMBINING = [chr(c) for c in range(0x0300, 0x0370)]


def assigned(cp):
  c = chr(cp)
  return unicodedata.category(c) not in ("Cn", "Cs", "Co")


def rand_script_text(rng, n):
  lo, hi = rng.choice(SCRIPT_RANGES)
  out = []
  while len(out) < n:
    cp = rng.randint(lo, hi)
    if assigned(cp):
      out.append(chr(cp))
    if rng.random() < 0.15:
      out.append(rng.choice([" ", " ", "\n", ", ", ". ", rng.choice(COMBINING)]))
  return "".join(out)


def rand_number(rng):
  kind = rng.randrange(8)
  digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
  if kind == 0:
    return digits
  if kind == 1:
    return f"{rng.randint(-10**6, 10**6):,}"
  if kind == 2:
    return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
  if kind == 3:
    return f"{rng.uniform(0, 1):.3e}"
  if kind == 4:
    return f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
  if kind == 5:
    return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
  if kind == 6:  # non-ASCII digits and numerals: Arabic-Indic, Devanagari, fullwidth, Roman, ²
    return "".join(rng.choice("٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３ⅠⅡⅢⅣ²³½¼") for _ in range(rng.randint(1, 8)))
  return "0x" + "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(1, 16)))


def rand_prose(rng, n_words):
  out = []
  for i in range(n_words):
    w = rng.choice(WORDS) if rng.random() > 0.08 else rng.choice(CONTRACTIONS)
    if rng.random() < 0.1:
      w = w.capitalize() if rng.random() < 0.7 else w.upper()
    if rng.random() < 0.05:
      w = rand_number(rng)
    out.append(w)
    r = rng.random()
    if r < 0.08:
      out.append(rng.choice([".", ",", "!", "?", ";", ":", " -", "...", " (", ")", '"', "—"]))
    out.append(" " if rng.random() > 0.05 else rng.choice(SPACES))
  return "".join(out)


def rand_whitespace_doc(rng):
  parts = []
  for _ in range(rng.randint(5, 40)):
    parts.append(rng.choice(SPACES) * rng.randint(1, 4))
    parts.append(rng.choice([rng.choice(WORDS), rand_number(rng), rng.choice(EMOJI), "x", "!", ""]))
  return "".join(parts)


def stdlib_sources(rng, count):
  root = sysconfig.get_paths()["stdlib"]
  files = sorted(f for f in os.listdir(root) if f.endswith(".py"))
  docs = []
  for name in rng.sample(files, min(count, len(files))):
    with open(os.path.join(root, name), encoding="utf-8", errors="replace") as fh:
      lines = fh.read().splitlines(keepends=True)
    if not lines:
      continue
    start = rng.randrange(len(lines))
    docs.append("".join(lines[start:start + rng.randint(10, 80)]))
  return docs


def mixed_doc(rng, pieces):
  makers = [
      lambda: rand_prose(rng, rng.randint(5, 60)),
      lambda: rand_script_text(rng, rng.randint(5, 80)),
      lambda: rng.choice(SPACES) * rng.randint(1, 6),
      lambda: rand_number(rng),
      lambda: "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 6))),
      lambda: rng.choice(SPECIALS),
      lambda: "".join(chr(rng.randrange(0, 32)) for _ in range(rng.randint(1, 3))),
      lambda: rng.choice(pieces) if pieces else "",
      lambda: "e" + "".join(rng.choice(COMBINING) for _ in range(rng.randint(1, 4))),
  ]
  return "".join(rng.choice(makers)() for _ in range(rng.randint(2, 12)))


def make_corpus(seed, min_bytes):
  rng = random.Random(seed)
  docs = [
      "Hello world! 123", "The capital of France is", "\n", "  multiple   spaces", "a   b",
      "", " ", "\r\n", "don't DON'T", "<|im_start|>user\nHi<|im_end|>\n", "1234567890",
  ]
  code = stdlib_sources(rng, 60)
  docs += code
  size = sum(len(d.encode()) for d in docs)
  while size < min_bytes:
    kind = rng.randrange(5)
    if kind == 0:
      d = rand_prose(rng, rng.randint(5, 120))
    elif kind == 1:
      d = rand_script_text(rng, rng.randint(5, 150))
    elif kind == 2:
      d = rand_whitespace_doc(rng)
    else:
      d = mixed_doc(rng, code[:20])
    docs.append(d)
    size += len(d.encode())
  return docs


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True)
  ap.add_argument("--bin")
  ap.add_argument("--seed", type=int, default=1234)
  ap.add_argument("--min-bytes", type=int, default=300 * 1024)
  args = ap.parse_args()
  docs = make_corpus(args.seed, args.min_bytes)
  with open(args.out, "w", encoding="utf-8") as fh:
    for d in docs:
      fh.write(json.dumps(d, ensure_ascii=True) + "\n")
  if args.bin:
    with open(args.bin, "wb") as fh:
      for d in docs:
        b = d.encode("utf-8")
        fh.write(b"%d\n" % len(b) + b + b"\n")
  print(f"corpus: {len(docs)} documents, {sum(len(d.encode()) for d in docs)} bytes (seed {args.seed})")


if __name__ == "__main__":
  main()
