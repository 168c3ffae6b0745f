#!/usr/bin/env bash
# CTest driver: the engine on small random llama and qwen2 models (float weights, several layers,
# GQA, head_dim 32 and 64, prompts longer than one attention tile, prefill in 48-token chunks) against the float64 NumPy
# reference. Checks the transformer itself — RoPE pairing per architecture, biases, attention,
# norms, MLP — without the real model. Exit 77 (skipped) when the Python environment is missing.
set -euo pipefail
SRC=$1 DUMP_BIN=$2 WRITE_BIN=$3
PY=$SRC/.venv/bin/python
if ! "$PY" -c "import numpy, gguf" 2>/dev/null; then
  echo "SKIP: .venv with numpy and gguf missing (run scripts/python-env)"; exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
#          arch  type layers embd heads kv_heads
for spec in "llama F32 3 128 4 2" "qwen2 F32 3 128 2 1" "llama F16 2 192 3 3"; do
  set -- $spec
  name="$1-$2-$3-$4-$5-$6"
  echo "== $name"
  "$WRITE_BIN" "$out/$name.gguf" "$@"
  mkdir "$out/$name"
  MAGICPIG_PREFILL_CHUNK=48 "$DUMP_BIN" "$out/$name.gguf" "$SRC/tests/e2e/synthetic_prompts.txt" "$out/$name" 16 float
  PYTHONPATH=$SRC/tests/reference "$PY" "$SRC/tests/e2e/compare_reference.py" \
    "$out/$name.gguf" "$out/$name" - 2 16
done
