#!/usr/bin/env bash
# SGLang's released wheels, read (never installed: they pin CUDA builds) by tests/export/test_sglang_rules.py, which
# checks eaglewire's per-model-file SGLang layer-id record against SGLang's own set_eagle3_layers_to_capture /
# set_dflash_layers_to_capture. The releases are eaglewire's (eaglewire.export.sglang_rules.RELEASES).
#   bash scripts/sglang_wheels.sh && export EAGLEWIRE_SGLANG_WHEELS=~/.cache/eaglewire/sglang-wheels
# The wheels (~40 MB each) live in the user cache, like the client venvs; one already there is kept.
set -euo pipefail
DEFAULT="${EAGLEWIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewire}/sglang-wheels"
D="${1:-$DEFAULT}"
PY="${PYTHON:-python}"
mkdir -p "$D"
for v in $("$PY" -c "from eaglewire.export.sglang_rules import RELEASES; print(' '.join(RELEASES))"); do
    ls "$D"/sglang-"$v"-*.whl >/dev/null 2>&1 || "$PY" -m pip download -q --no-deps --only-binary=:all: "sglang==$v" -d "$D"
done
