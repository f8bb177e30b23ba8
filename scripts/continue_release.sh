#!/usr/bin/env bash
# One more session of training for the released draft: warm-start from the committed release and train on
# every shipped regenerated conversation (features captured once into the cache; the capture resumes).
# Training adds up across sessions and machines this way: the state carried over is the committed draft
# (optimizer and lr schedule start afresh, as `--init-from` documents).
#   bash scripts/continue_release.sh [WORK_DIR] [MAX_STEPS]
# Knobs by environment: LR (peak, default 5e-4), SUPERVISE (answers|all), LOSS (train --loss), VOCAB (a vocab
# map file), OUT (the run dir; default one per day, so a second run on one day needs its own), TTT (TTT
# positions, default 3), DECAY (loss weight decay**position, default train's), INIT (the warm start, default
# the committed release), SKIP (capture only the valid conversations after the first SKIP of DATA: those an
# earlier run trained on; SKIP=4543 picks the conversations the corpus growth of 2026-12-01 added),
# FEATURES (the feature dir, default WORK/features, or WORK/features-skipSKIP).
# Resumable: capture continues at the first missing shard, training with --resume from its checkpoint.
set -euo pipefail
W="${1:-${EAGLEWIRE_CACHE:-$HOME/.cache/eaglewire}/release-work}"
STEPS="${2:-700}"
DATA="smollm2-regen+smollm2-regen-vllm"
RELEASED="${INIT:-src/eaglewire/assets/drafts/smollm2-135m}"
VOCAB="${VOCAB:-$W/vocab.safetensors}"
SKIP="${SKIP:-0}"
FEATURES="${FEATURES:-$W/features$([ "$SKIP" = 0 ] || echo "-skip$SKIP")}"
OUT="${OUT:-$W/continue-$(date +%Y%m%d)}"
TDTYPE=$(python -c "from eaglewire.hw import native_bf16; print('bfloat16' if native_bf16() else 'float32')")
# the warm start's own map: every head row of it is trained (a map rebuilt from data would swap some out)
[ -f "$VOCAB" ] || eaglewire vocab build --data "$DATA" --limit 2817 --out "$VOCAB" --keep-from "$RELEASED"
eaglewire data capture --data "$DATA" --skip "$SKIP" --out "$FEATURES" --target-dtype "$TDTYPE" --batch-size 8
RESUME=""; [ -f "$OUT/checkpoints/latest" ] && RESUME="--resume"
# The warm start is copied once into the run dir: a resume must not read a release this run replaced.
[ -d "$OUT/init" ] || { mkdir -p "$OUT" && cp -r "$RELEASED" "$OUT/init"; }
eaglewire train --features "$FEATURES" --vocab "$VOCAB" --out "$OUT" $RESUME --init-from "$OUT/init" \
  --max-steps "$STEPS" --batch-size 8 --ttt-steps "${TTT:-3}" ${DECAY:+--ttt-decay "$DECAY"} --lr "${LR:-5e-4}" --warmup-steps 20 \
  --supervise "${SUPERVISE:-answers}" --loss "${LOSS:-soft_ce}" --eval-every 100 --ckpt-every 50
echo "release with: python scripts/release_draft.py $OUT"
