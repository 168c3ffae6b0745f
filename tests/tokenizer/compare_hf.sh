#!/usr/bin/env bash
# Differential test of magicpig's tokenizer against Hugging Face `tokenizers` on the real model.
#
#   tests/tokenizer/compare_hf.sh PATH/TO/magicpig_tokenize_corpus [SOURCE_DIR]
#   tests/tokenizer/compare_hf.sh --setup [SOURCE_DIR]     # create .venv with numpy gguf tokenizers
#
# For each seed in MAGICPIG_HF_SEEDS (default "1234 99 2024") it generates a corpus
# (make_corpus.py), encodes it with HF (hf_reference.py, vocabulary read by the PyPI `gguf`
# package) and with magicpig (magicpig_tokenize_corpus), and compares ids and decoded text
# (compare_ids.py). The first seed is also run with the pre-tokenizer overridden to each of
# MAGICPIG_HF_OTHER_PRES (default "llama-bpe qwen2") on both sides. Exit 0 when everything matches, 1 on a mismatch, 77 (CTest SKIP) when the model
# or the Python packages are missing. Environment: MAGICPIG_TOKENIZER_MODEL (default
# models/SmolLM2-135M-Instruct.Q4_1.gguf), MAGICPIG_VENV (default SOURCE_DIR/.venv),
# MAGICPIG_HF_SETUP=1 to create the venv instead of skipping.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tool="${1:?usage: compare_hf.sh TOOL|--setup [SOURCE_DIR]}"
src="${2:-$(cd "$here/../.." && pwd)}"
venv="${MAGICPIG_VENV:-$src/.venv}"
py="$venv/bin/python"

setup_venv() {
  python3 -m venv "$venv"
  "$py" -m pip install --quiet numpy gguf tokenizers
}

if [[ "$tool" == "--setup" ]]; then
  setup_venv
  exit 0
fi

model="${MAGICPIG_TOKENIZER_MODEL:-$src/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -f "$model" ]]; then
  echo "SKIP: model not found at $model (download it first; see scripts/)"
  exit 77
fi
if ! { [[ -x "$py" ]] && "$py" -c "import gguf, tokenizers, numpy" 2>/dev/null; }; then
  if [[ "${MAGICPIG_HF_SETUP:-0}" == "1" ]]; then
    setup_venv
  else
    echo "SKIP: $venv lacks numpy/gguf/tokenizers (run: $0 --setup, or set MAGICPIG_HF_SETUP=1)"
    exit 77
  fi
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$py" -c "import tokenizers, gguf; print('tokenizers', tokenizers.__version__)"
status=0
for seed in ${MAGICPIG_HF_SEEDS:-1234 99 2024}; do
  echo "== seed $seed"
  "$py" "$here/make_corpus.py" --seed "$seed" --out "$work/corpus.jsonl" --bin "$work/corpus.bin"
  "$py" "$here/hf_reference.py" --model "$model" --corpus "$work/corpus.jsonl" \
    --ids "$work/hf_ids.txt" --decoded "$work/hf_dec.bin"
  "$tool" "$model" "$work/corpus.bin" "$work/cc_ids.txt" "$work/cc_dec.bin" || status=1
  "$py" "$here/compare_ids.py" "$work/corpus.jsonl" "$model" "$work/hf_ids.txt" \
    "$work/cc_ids.txt" "$work/hf_dec.bin" "$work/cc_dec.bin" || status=1
done
first_seed="$(echo ${MAGICPIG_HF_SEEDS:-1234 99 2024} | cut -d' ' -f1)"
for pre in ${MAGICPIG_HF_OTHER_PRES:-llama-bpe qwen2}; do
  echo "== seed $first_seed, pre-tokenizer overridden to $pre"
  "$py" "$here/make_corpus.py" --seed "$first_seed" --out "$work/corpus.jsonl" --bin "$work/corpus.bin"
  "$py" "$here/hf_reference.py" --model "$model" --corpus "$work/corpus.jsonl" --pre "$pre" \
    --ids "$work/hf_ids.txt" --decoded "$work/hf_dec.bin"
  "$tool" "$model" "$work/corpus.bin" "$work/cc_ids.txt" "$work/cc_dec.bin" "$pre" || status=1
  "$py" "$here/compare_ids.py" "$work/corpus.jsonl" "$model" "$work/hf_ids.txt" \
    "$work/cc_ids.txt" "$work/hf_dec.bin" "$work/cc_dec.bin" || status=1
done
if [[ $status -eq 0 ]]; then echo "PASS: identical to Hugging Face tokenizers"; fi
exit $status
