#!/usr/bin/env bash
# A second venv with the real `speculators` package (it needs transformers <= 5.19, eaglewire uses newer),
# used by tests/export/test_real_clients.py to load our vLLM/speculators export with speculators' own Eagle3 class.
# (httpx: imported by speculators.train, which benchmarks/peer_training/peer_training.py drives.)
#   bash scripts/speculators_venv.sh && export EAGLEWIRE_SPECULATORS_PYTHON=~/.cache/eaglewire/client-venvs/speculators/bin/python
# The venv lives in the user cache (a third-party tree does not belong in the repository).
set -euo pipefail
DEFAULT="${EAGLEWIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewire}/client-venvs/speculators"
V="${1:-$DEFAULT}"
python3 -m venv "$V"
"$V/bin/pip" install -q torch==2.13.0
"$V/bin/pip" install -q "transformers==5.19.0" safetensors pydantic pydantic-settings loguru openai httpx "datasets>=4.0,<=5.1"
"$V/bin/pip" install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
