#!/usr/bin/env bash
# CTest driver for openai_client_test.py: the real model through the official `openai` client.
#   run_openai_client_test.sh SOURCE_DIR GPU_NODE MAGICPIG_CLI
# Exit 77 (CTest SKIP) without the model or a .venv with `openai` (scripts/fetch-model,
# scripts/python-env).
set -euo pipefail
src=$1 node=$2 cli=$3
model="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf"
py="${MAGICPIG_VENV:-$src/.venv}/bin/python"
if [[ ! -f "$model" ]]; then
  echo "SKIP: $model missing (run scripts/fetch-model)"
  exit 77
fi
if ! { [[ -x "$py" ]] && "$py" -c "import openai" 2>/dev/null; }; then
  echo "SKIP: .venv with openai missing (run scripts/python-env)"
  exit 77
fi
exec "$py" "$src/tests/server/openai_client_test.py" "$node" "$cli" "$model"
