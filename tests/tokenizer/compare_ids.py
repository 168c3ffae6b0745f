#!/usr/bin/env python3
"""Compares magicpig's token ids and decoded texts with Hugging Face's (see compare_hf.sh).

Prints how many documents, bytes and tokens were compared and, for the first mismatching
document, the first differing position with the surrounding ids and their token strings.
Exit status: 0 if everything matches, 1 otherwise.

Usage: compare_ids.py CORPUS.jsonl MODEL.gguf HF_IDS CC_IDS HF_DECODED CC_DECODED
"""

import json
import sys


def read_ids(path):
  with open(path) as fh:
    return [[int(x) for x in line.split()] for line in fh]


def read_records(path):
  out = []
  with open(path, "rb") as fh:
    while True:
      header = fh.readline()
      if not header:
        return out
      n = int(header)
      out.append(fh.read(n))
      fh.read(1)


def token_strings(model):
  try:
    from gguf import GGUFReader
    return GGUFReader(model).fields["tokenizer.ggml.tokens"].contents()
  except Exception:  # context only; the comparison does not need it
    return None


def main():
  corpus, model, hf_ids_path, cc_ids_path, hf_dec_path, cc_dec_path = sys.argv[1:7]
  with open(corpus, encoding="utf-8") as fh:
    docs = [json.loads(line) for line in fh]
  hf_ids, cc_ids = read_ids(hf_ids_path), read_ids(cc_ids_path)
  hf_dec, cc_dec = read_records(hf_dec_path), read_records(cc_dec_path)
  if not (len(docs) == len(hf_ids) == len(cc_ids) == len(hf_dec) == len(cc_dec)):
    print(f"FAIL: document counts differ: corpus {len(docs)}, hf {len(hf_ids)}, "
          f"magicpig {len(cc_ids)}, decoded {len(hf_dec)}/{len(cc_dec)}")
    return 1
  id_mismatch = [i for i in range(len(docs)) if hf_ids[i] != cc_ids[i]]
  dec_mismatch = [i for i in range(len(docs)) if hf_dec[i] != cc_dec[i]]
  n_bytes = sum(len(d.encode("utf-8")) for d in docs)
  n_tokens = sum(map(len, hf_ids))
  print(f"compared {len(docs)} documents, {n_bytes} bytes, {n_tokens} HF tokens: "
        f"{len(docs) - len(id_mismatch)} documents with identical ids, "
        f"{len(docs) - len(dec_mismatch)} with identical decoded text")
  if id_mismatch:
    i = id_mismatch[0]
    a, b = hf_ids[i], cc_ids[i]
    k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
    strings = token_strings(model)
    show = lambda ids: [(t, strings[t] if strings else "?") for t in ids]
    print(f"FIRST ID MISMATCH: document {i} at token {k} (hf {len(a)} tokens, magicpig {len(b)})")
    print(f"  text: {docs[i][:300]!r}")
    print(f"  hf:       {show(a[max(0, k - 3):k + 5])}")
    print(f"  magicpig: {show(b[max(0, k - 3):k + 5])}")
  if dec_mismatch:
    i = dec_mismatch[0]
    print(f"FIRST DECODE MISMATCH: document {i}: hf {hf_dec[i][:200]!r} vs "
          f"magicpig {cc_dec[i][:200]!r}")
  return 1 if id_mismatch or dec_mismatch else 0


if __name__ == "__main__":
  sys.exit(main())
