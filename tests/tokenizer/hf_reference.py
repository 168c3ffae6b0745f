#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers` for the conformance corpus.

Builds an HF Tokenizer from the GGUF's own vocabulary and merges, read with the PyPI `gguf`
package's GGUFReader (independent of magicpig's C++ reader):
  model:         BPE(vocab, merges), no unknown token (bytes without a token are dropped)
  pre-tokenizer: per tokenizer.ggml.pre, e.g. smollm = Sequence[Digits(individual_digits=True),
                 ByteLevel(add_prefix_space=False, use_regex=True)]
  decoder:       ByteLevel
  added tokens:  control tokens (type 3) as special, user-defined (type 4) as normal added tokens
Writes one line of space-separated ids per document, and the decoded texts (specials skipped) as
"<byte length>\\n<bytes>\\n" records.

Usage: hf_reference.py --model M.gguf --corpus corpus.jsonl --ids hf_ids.txt --decoded hf_dec.bin
                       [--pre llama-bpe]
"""

import argparse
import json

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

SMOLLM_FAMILY = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def field(reader, key):
  f = reader.fields.get(key)
  return None if f is None else f.contents()


def build(model_path, pre_override=None):
  r = GGUFReader(model_path)
  if field(r, "tokenizer.ggml.model") != "gpt2":
    raise SystemExit("only gpt2 (byte-level BPE) vocabularies are supported")
  pre = pre_override or field(r, "tokenizer.ggml.pre")
  tokens = field(r, "tokenizer.ggml.tokens")
  types = field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)
  merges = [tuple(m.split(" ")) for m in field(r, "tokenizer.ggml.merges")]
  vocab = {}
  for i, t in enumerate(tokens):
    vocab.setdefault(t, i)  # first id wins, as in the C++ tokenizer
  ignore_merges = pre in ("llama-bpe", "llama3")
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                             byte_fallback=False, ignore_merges=ignore_merges))
  if pre in SMOLLM_FAMILY:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  elif pre in ("llama-bpe", "llama3", "qwen2"):
    pattern = QWEN2 if pre == "qwen2" else LLAMA3
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  else:
    raise SystemExit(f"no HF equivalent configured for pre-tokenizer {pre!r}")
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, ty in zip(tokens, types) if ty == 3])
  user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4]
  if user:
    tok.add_tokens(user)
  return tok


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", required=True)
  ap.add_argument("--corpus", required=True)
  ap.add_argument("--ids", required=True)
  ap.add_argument("--decoded", required=True)
  ap.add_argument("--pre", help="override tokenizer.ggml.pre")
  args = ap.parse_args()
  tok = build(args.model, args.pre)
  with open(args.corpus, encoding="utf-8") as fh:
    docs = [json.loads(line) for line in fh]
  encodings = tok.encode_batch(docs, add_special_tokens=False)
  ids = [e.ids for e in encodings]
  with open(args.ids, "w") as fh:
    for row in ids:
      fh.write(" ".join(map(str, row)) + "\n")
  decoded = tok.decode_batch(ids, skip_special_tokens=True)
  with open(args.decoded, "wb") as fh:
    for d in decoded:
      b = d.encode("utf-8")
      fh.write(b"%d\n" % len(b) + b + b"\n")
  print(f"hf: {len(docs)} documents, {sum(map(len, ids))} tokens")


if __name__ == "__main__":
  main()
