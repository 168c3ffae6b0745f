#!/usr/bin/env bash
# CTest driver for json_python_compare.py: runs it with the project's .venv Python when there is
# one (scripts/python-env), else python3; only the standard library is needed.
#   run_json_python_compare.sh SOURCE_DIR PATH/TO/magicpig_json_corpus
# Exit 77 (CTest SKIP) when no Python 3 is found.
set -euo pipefail
src=$1 driver=$2
py="${MAGICPIG_VENV:-$src/.venv}/bin/python"
if [[ ! -x "$py" ]]; then
  py="$(command -v python3 || true)"
fi
if [[ -z "$py" ]]; then
  echo "SKIP: no Python 3 (neither .venv nor python3 on PATH)"
  exit 77
fi
exec "$py" "$src/tests/json/json_python_compare.py" "$driver"
