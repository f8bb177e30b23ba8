#!/usr/bin/env bash
# Retired one-off: kept beside the results it wrote as the exact command that made them (run from the repo root).
# Can positions 2-3 get their TTT back without undoing the first position that TTT 1 bought?
# The release of 2026-12-01 was trained TTT 1: held-out first position 0.49 -> 0.71, but the live third position
# fell (conditional 0.45 -> 0.13). A plain TTT-3 phase at lr 5e-4 gave the first-position gain back
# (benchmarks/results/recipe/2026-12-01-epyc-avx512/warm_schedule.txt). Here: TTT-3 tails from the release at a low lr, with the
# default position weights (decay 0.8: 1, 0.8, 0.64) and with the first position dominant (decay 0.3:
# 1, 0.3, 0.09); base = the release itself evaluated with 3 TTT positions (one step at lr 1e-9).
# Batch 8, prompt tokens supervised, fresh optimizer (as --init-from documents).
#   bash benchmarks/results/recipe/2026-12-01-epyc-avx512/ttt3_tail.sh [WORK_DIR] [STEPS]     (finished runs are kept; results in WORK/ttt3-tail)
set -euo pipefail
W="${1:-${EAGLEWIRE_CACHE:-$HOME/.cache/eaglewire}/release-work}"
STEPS="${2:-150}"
R="$W/ttt3-tail"
mkdir -p "$R"
[ -d "$R/init" ] || cp -r src/eaglewire/assets/drafts/smollm2-135m "$R/init"
COMMON=(--features "$W/features" --vocab "$W/vocab.safetensors" --batch-size 8 --warmup-steps 10
        --supervise all --ckpt-every 50 --ttt-steps 3 --init-from "$R/init")
run() {  # NAME MAX_STEPS LR DECAY
  [ -f "$R/$1/summary.json" ] && return
  local t0=$SECONDS
  eaglewire train "${COMMON[@]}" --out "$R/$1" --max-steps "$2" --lr "$3" --ttt-decay "$4" \
    --eval-every 50 > "$R/$1.log" 2>&1
  echo $((SECONDS - t0)) > "$R/$1/wall_s.txt"
}
run base 1 1e-9 0.8
run tail_d03 "$STEPS" 1.5e-4 0.3
run tail_d08 "$STEPS" 1.5e-4 0.8
for n in base tail_d03 tail_d08; do
  python - "$R/$n" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if '"split": "heldout"' in l]
for r in rows:
    print(f"{d.name} step {r['step']}: held-out top-1 {[round(a, 3) for a in r['acc']]}")
print(f"{d.name}: wall {(d / 'wall_s.txt').read_text().strip()} s")
PY
done | tee "$R/summary.txt"
# The bench of each (τ at MT-bench 8 prompts spread over the categories, 128 tokens, chain k=3):
#   eaglewire bench --draft WORK/ttt3-tail/NAME/draft --limit 8 --max-new-tokens 128 --num-speculative-tokens 3 \
#     --methods vanilla,eagle_chain --out WORK/ttt3-tail/bench-NAME
# Results: benchmarks/results/recipe/<date>-<cpu>/ttt3_tail.txt
