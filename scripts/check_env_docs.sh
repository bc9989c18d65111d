#!/usr/bin/env bash
# scripts/check_env_docs.sh -- every OT_* / OTE_* environment variable named in the library, the
# Python package or the tools (a quoted "OT_..." literal: what getenv / os.environ read)
# has a row in docs/ENVIRONMENT.md (a literal ending in '_', e.g. "OT_NORM_", is a prefix
# a scan of the environment matches, not a variable). Run by scripts/test.sh; exits 1 naming the missing ones.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
missing=()
for v in $(grep -rhoE "[\"']OTE?_[A-Z0-9_]+[\"']" src tools python/ops_transformer \
             --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
             --include='*.py' | tr -d "\"'" | grep -v '_$' | sort -u); do
  grep -q "\`$v\`" docs/ENVIRONMENT.md || missing+=("$v")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "docs/ENVIRONMENT.md lacks a row for: ${missing[*]}" >&2
  exit 1
fi
echo "docs/ENVIRONMENT.md: every OT_* / OTE_* environment variable is listed"
