#!/usr/bin/env bash
# CTest driver: engine logits and greedy tokens vs the float64 NumPy reference, on a real model
# (see compare_reference.py for the criteria). Exit 77 (skipped) when the model or the Python
# environment is missing.
#
#   reference_compare.sh SOURCE_DIR DUMP_BIN [MODEL_FILE [PROMPTS_FILE [GREEDY_TOKENS [q8-exact]]]]
#
# MODEL_FILE defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf (relative to SOURCE_DIR),
# PROMPTS_FILE to tests/e2e/reference_prompts.txt, GREEDY_TOKENS to 32.
set -euo pipefail
SRC=$1 DUMP_BIN=$2
MODEL=$SRC/${3:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PROMPTS=$SRC/${4:-tests/e2e/reference_prompts.txt}
GREEDY=${5:-32}
PY=$SRC/.venv/bin/python
if [ ! -f "$MODEL" ]; then echo "SKIP: $MODEL missing (run scripts/fetch-model)"; exit 77; fi
if ! "$PY" -c "import numpy, gguf" 2>/dev/null; then
  echo "SKIP: .venv with numpy and gguf missing (run scripts/python-env)"; exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir "$out/float" "$out/q8"
"$DUMP_BIN" "$MODEL" "$PROMPTS" "$out/float" "$GREEDY" float
"$DUMP_BIN" "$MODEL" "$PROMPTS" "$out/q8" "$GREEDY" q8
n=$(ls "$out"/float/*.ids | wc -l)
PYTHONPATH=$SRC/tests/reference "$PY" "$SRC/tests/e2e/compare_reference.py" "$MODEL" \
  "$out/float" "$out/q8" "$n" "$GREEDY" ${6:-}
