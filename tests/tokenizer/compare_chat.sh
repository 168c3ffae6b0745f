#!/usr/bin/env bash
# CTest driver: magicpig's chat templates against the model's Jinja template rendered by jinja2
# (compare_chat.py). Exit 77 (skipped) when the model or the Python environment is missing.
#
#   compare_chat.sh SOURCE_DIR RENDER_TOOL MODEL_FILE
set -euo pipefail
SRC=$1 TOOL=$2
MODEL=$SRC/$3
PY=$SRC/.venv/bin/python
if [ ! -f "$MODEL" ]; then echo "SKIP: $MODEL missing (run scripts/fetch-model)"; exit 77; fi
if ! "$PY" -c "import gguf, jinja2" 2>/dev/null; then
  echo "SKIP: .venv with gguf and jinja2 missing (run scripts/python-env)"; exit 77
fi
"$PY" "$SRC/tests/tokenizer/compare_chat.py" "$MODEL" "$TOOL"
