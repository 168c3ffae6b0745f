#!/usr/bin/env bash
# CTest driver for http_client_test.py: runs it with the project's .venv (scripts/python-env) when
# there is one, else with python3 (it needs only the standard library).
#   run_http_client_test.sh SOURCE_DIR PATH/TO/http_interop_server
# Exit 77 (CTest SKIP) when no Python 3 is found.
set -euo pipefail
src=$1 server=$2
py="${MAGICPIG_VENV:-$src/.venv}/bin/python"
if [[ ! -x "$py" ]]; then
  py="$(command -v python3 || true)"
fi
if [[ -z "$py" ]]; then
  echo "SKIP: no Python 3 (run scripts/python-env)"
  exit 77
fi
exec "$py" "$src/tests/http/http_client_test.py" "$server"
