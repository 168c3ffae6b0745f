#!/usr/bin/env bash
# CTest driver: dumps SmolLM2's keys, values and last 8 queries of every layer at 2048 tokens of
# examples/buried_fact.txt (magicpig_dump_qk), then runs the real-key accuracy test on that dump.
# Exit 77 (skipped) when the model is missing.
#
#   real_accuracy_test.sh SOURCE_DIR DUMP_BIN TEST_BIN
#
# All 28 sparse layers rather than a few: the long-tailed heads the test compares on are ~20% of
# the heads, and a 3-layer subset holds too few of them for a stable mean (docs/benchmarks.md).
set -euo pipefail
SRC=$1 DUMP_BIN=$2 TEST_BIN=$3
MODEL=$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$MODEL" ]; then echo "SKIP: $MODEL missing (run scripts/fetch-model)"; exit 77; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$DUMP_BIN" --model "$MODEL" --text "$SRC/examples/buried_fact.txt" --tokens 2048 --queries 8 \
  --out "$out/qk.bin"
MAGICPIG_QK_DUMP="$out/qk.bin" "$TEST_BIN"
