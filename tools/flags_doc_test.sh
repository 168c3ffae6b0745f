#!/usr/bin/env bash
# Fails when docs/flags.md differs from what the flag tables generate (scripts/flags-doc rewrites
# it). Usage: flags_doc_test.sh MAGICPIG_FLAGS_DOC_BINARY DOCS_FLAGS_MD
set -euo pipefail
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
# The environment must not leak into the defaults shown.
env -i "$1" >"$generated"
if ! diff -u "$2" "$generated"; then
  echo "docs/flags.md is stale: run scripts/flags-doc and commit the result" >&2
  exit 1
fi
echo "docs/flags.md matches the flag tables ($(grep -c '^| `--' "$generated") flags)"
