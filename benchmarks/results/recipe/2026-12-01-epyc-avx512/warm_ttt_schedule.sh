#!/usr/bin/env bash
# Retired one-off: kept beside the results it wrote as the exact command that made them (run from the repo root).
# Does a TTT-1 phase buy more tau per CPU minute than TTT 3 when warm-starting from the released draft?
# Three runs of about the same CPU time from the release (TTT 1 costs ~1/3 of TTT 3 per step:
# benchmarks/results/recipe/2026-12-01-epyc-avx512/cost.json), each benched on MT-bench (8 prompts spread over the categories, 128
# tokens, chain k=3, target fp32):  ttt3 = 120 steps TTT 3;  ttt1 = 360 steps TTT 1;
# ttt1_then_3 = 240 steps TTT 1, then 40 steps TTT 3 from it. Batch 8, lr 5e-4, prompt tokens supervised.
#   bash benchmarks/results/recipe/2026-12-01-epyc-avx512/warm_ttt_schedule.sh [WORK_DIR]      (finished runs are kept; results in WORK/*/bench)
set -euo pipefail
W="${1:-${EAGLEWIRE_CACHE:-$HOME/.cache/eaglewire}/release-work}"
R="$W/warm-schedule"
mkdir -p "$R"
[ -d "$R/init" ] || cp -r src/eaglewire/assets/drafts/smollm2-135m "$R/init"
COMMON=(--features "$W/features" --vocab "$W/vocab.safetensors" --batch-size 8 --lr 5e-4 --warmup-steps 20
        --supervise all --ckpt-every 50)
run() {  # NAME INIT TTT STEPS
  [ -f "$R/$1/summary.json" ] && return
  local t0=$SECONDS
  eaglewire train "${COMMON[@]}" --out "$R/$1" --init-from "$2" --ttt-steps "$3" --max-steps "$4" \
    --eval-every "$4" > "$R/$1.log" 2>&1
  echo $((SECONDS - t0)) > "$R/$1/wall_s.txt"
}
run ttt3 "$R/init" 3 120
run ttt1 "$R/init" 1 360
run ttt1_then_3.phase1 "$R/init" 1 240
run ttt1_then_3 "$R/ttt1_then_3.phase1/draft" 3 40
for n in ttt3 ttt1 ttt1_then_3; do
  [ -f "$R/$n/bench/bench.json" ] || eaglewire bench --draft "$R/$n/draft" --limit 8 --max-new-tokens 128 \
    --num-speculative-tokens 3 --methods vanilla,eagle_chain --out "$R/$n/bench" > "$R/$n.bench.log" 2>&1
  python - "$R/$n" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1]); b = json.loads((d / "bench/bench.json").read_text())["methods"]["eagle_chain"]
h = json.loads((d / "summary.json").read_text())["heldout"]["acc"]
walls = [int(p.read_text()) for p in d.parent.glob(d.name + "*/wall_s.txt")]
print(f"{d.name}: wall {sum(walls)} s, held-out top-1 {[round(a, 3) for a in h]}, tau {b['tau']:.3f}, "
      f"per-position {[round(p, 3) for p in b['per_position']]}")
PY
done | tee "$R/summary.txt"
