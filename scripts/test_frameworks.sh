#!/usr/bin/env bash
# Run tests/integrations/test_convert.py (and each framework's own test file) against the frameworks'
# real classes, one side environment per framework (their pins conflict with each other and with
# vLLM's, so none goes in .venv).
#   bash scripts/test_frameworks.sh [verl areal slime miles prime-rl nemo-rl]  (default: verl areal)
# verl is layered over the project's .venv (scripts/install_verl.sh) and also runs its own tests
# (tests/integrations/test_verl*.py: the sampler on TransferQueue and a local Ray with scripted
# workers; the checkpoint engine on two gloo ranks with a torch worker; fully_async's MessageQueue;
# the sampler's hang-to-error bound).
# AReaL installs from PyPI; slime, miles, prime-rl and NeMo-RL have no PyPI package (PyPI's nemo-rl
# is an empty placeholder): point SLIME_SRC, MILES_SRC, PRIME_RL_SRC and NEMO_RL_SRC at checkouts
# (THUDM/slime@624b824a, radixark/miles@31f1ca96, PrimeIntellect-ai/prime-rl@559b4477,
# NVIDIA-NeMo/RL@7ea279ab). NeMo-RL needs Python 3.13 (PYTHON313, default python3.13) and is
# imported from its source with the part of its dependencies its sampler, replay buffer, data plane
# and GRPO payload code import (torch 2.11 as it pins; no vLLM, Megatron or GPU). miles is imported from its source, not installed (its
# setup pulls sglang and Megatron, GPU-only); tests/integrations/framework_src.py says why.
# Needs a redis-server on PATH (the slime rollout test starts a private one). Several GB per venv (ray).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${FRAMEWORK_VENVS:-/tmp/rq-frameworks}
PYTHON=${PYTHON:-python3}
BASE=(redis orjson pytest pytest-timeout hypothesis pyyaml)
run() {  # name, then pip arguments (each line one install)
  local name=$1; shift
  local venv="$ROOT/$name"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q "${BASE[@]}"
  while [ $# -gt 0 ]; do eval "\"$venv/bin/pip\" install -q $1"; shift; done
  echo "== $name"
  PYTHONPATH="$PWD" ROLLOUT_TEST_SERVERS=redis HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider ${TESTS:-tests/integrations/test_convert.py} -rs
}
for fw in "${@:-verl areal}"; do
  for one in $fw; do
    case $one in
      verl) bash scripts/install_verl.sh .venv "$ROOT/verl"
        echo "== verl"
        PYTHONPATH="$PWD" ROLLOUT_TEST_SERVERS=redis HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled \
          "$ROOT/verl/bin/python" -m pytest -q -p no:cacheprovider -rs tests/integrations/test_convert.py \
          tests/integrations/test_verl_sampler.py tests/integrations/test_verl_weights.py \
          tests/integrations/test_verl_message_queue.py tests/integrations/test_framework_seams.py \
          tests/integrations/test_hang_to_error.py::test_verls_v1_sampler_raises_workers_gone_within_the_bound ;;
      areal) run areal "torch==2.13.0" "--no-deps areal==1.0.4" \
        "numpy 'transformers>=5.0,<=5.3.0' pillow aiohttp httpx colorlog tenacity flask torchdata lark uvloop hydra-core ray numba einops aiofiles openai" ;;
      slime) TESTS="tests/integrations/test_convert.py tests/integrations/test_slime.py" \
        run slime "torch==2.13.0" "--no-deps ${SLIME_SRC:?set SLIME_SRC to a THUDM/slime checkout}" \
        "httpx ray pillow transformers" ;;
      miles) : "${MILES_SRC:?set MILES_SRC to a radixark/miles checkout}"
        MILES_SRC=$MILES_SRC TESTS="tests/integrations/test_miles.py tests/weights/test_miles_delta.py" \
        run miles "torch==2.13.0" "ray pylatexenc numpy transformers safetensors zstandard xxhash" ;;
      nemo-rl) : "${NEMO_RL_SRC:?set NEMO_RL_SRC to an NVIDIA-NeMo/RL checkout}"
        PYTHON=${PYTHON313:-python3.13} NEMO_RL_SRC=$NEMO_RL_SRC \
        TESTS="tests/integrations/test_nemo_rl.py tests/integrations/test_framework_seams.py" \
        run nemo-rl "torch==2.11.0 'transformers>=5.5.0,<5.9.0' 'ray>=2.55.1' tensordict pydantic numpy datasets rich \
          accelerate tensorboard omegaconf torchdata nvidia-ml-py hydra-core matplotlib plotly sympy pillow \
          mlflow swanlab pyzmq soundfile zstandard prometheus_client wandb hiredis fsspec" ;;
      prime-rl) run prime-rl "--no-deps --ignore-requires-python ${PRIME_RL_SRC:?set PRIME_RL_SRC to a prime-rl checkout}" \
        "--no-deps --ignore-requires-python ${PRIME_RL_SRC}/packages/prime-rl-configs" \
        "msgspec pydantic prime-pydantic-config==0.4.3 pyzmq" ;;
      *) echo "unknown framework $one (verl, areal, slime, miles, prime-rl, nemo-rl)" >&2; exit 2 ;;
    esac
  done
done
