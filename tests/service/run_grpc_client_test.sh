#!/usr/bin/env bash
# CTest driver for grpc_client_test.py: runs it with the project's .venv (scripts/python-env).
#   run_grpc_client_test.sh SOURCE_DIR PATH/TO/magicpig_attn_node
# Exit 77 (CTest SKIP) when the venv lacks grpcio / grpcio-tools / numpy.
set -euo pipefail
src=$1 node=$2
py="${MAGICPIG_VENV:-$src/.venv}/bin/python"
if ! { [[ -x "$py" ]] && "$py" -c "import grpc, grpc_tools, numpy" 2>/dev/null; }; then
  echo "SKIP: .venv with grpcio, grpcio-tools and numpy missing (run scripts/python-env)"
  exit 77
fi
exec "$py" "$src/tests/service/grpc_client_test.py" "$node" "$src"
