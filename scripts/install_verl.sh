#!/usr/bin/env bash
# verl 0.9.1 beside the project's environment, for the verl integration tests:
#   bash scripts/install_verl.sh [BASE_VENV] [TARGET]      (defaults: .venv, /tmp/rq-frameworks/verl)
# TARGET is a venv layered over BASE_VENV (a .pth puts BASE's site-packages after its own), so it
# sees torch, vLLM, TRL and the package exactly as pinned there, and adds only what verl's V1
# sampler, checkpoint callback, checkpoint engines and TransferQueue import. Not installed into
# BASE_VENV itself: verl's omegaconf needs antlr4-python3-runtime 4.9.* and BASE has 4.13 (moto's);
# verl's own pins (transformers<5.11, torch==2.11) would downgrade the rest, so everything is --no-deps.
# Measured: ~250 MB, ~30 s with a warm pip cache.
set -euo pipefail
BASE=${1:-.venv}
TARGET=${2:-/tmp/rq-frameworks/verl}
PYTHON=$(readlink -f "$BASE/bin/python")
[ -x "$TARGET/bin/python" ] || "$PYTHON" -m venv "$TARGET"
SITE=$("$BASE/bin/python" -c 'import site; print(site.getsitepackages()[0])')
"$TARGET/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/zz_rollout_queue_base.pth", "w").write(sys.argv[1] + "\n")' "$SITE"
"$TARGET/bin/pip" install -q --no-deps verl==0.9.1 ray==2.60.0 TransferQueue==0.1.11 tensordict==0.10.0 \
  hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 codetiming==1.4.0 torchdata==0.11.0 \
  pyvers==0.1.0 msgpack==1.2.4
"$TARGET/bin/python" -c 'import verl.trainer.ppo.v1.trainer_separate_async, verl.checkpoint_engine.base, transfer_queue' 2>/dev/null
echo "install_verl: verl $("$TARGET/bin/python" -c 'import verl; print(verl.__version__)') in $TARGET (over $BASE)"
