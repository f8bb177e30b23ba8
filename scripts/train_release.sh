#!/usr/bin/env bash
# The released draft for the embedded SmolLM2-135M, end to end from the shipped regenerated conversations:
# vocab -> capture (target in bf16 where the CPU has native bf16) -> one pass of TTT training with
# log-spaced snapshots (the data-scaling curve) -> tau of each snapshot -> release.
#   bash scripts/train_release.sh [WORK_DIR] [MAX_STEPS] [CONVERSATIONS]
# Defaults are the 2026-12-01 release: 500 steps on the first 2817 conversations (2816 samples = 11 shards).
# Resumable: capture continues at the first missing shard; training with --resume from its checkpoint.
set -euo pipefail
W="${1:-${EAGLEWIRE_CACHE:-$HOME/.cache/eaglewire}/release-work}"
STEPS="${2:-500}"
LIMIT="${3:-2817}"
DATA="smollm2-regen+smollm2-regen-vllm"   # ShareGPT conversations [0, 640) by HF generate, [640, ...) by vLLM
VD="${VD:-8000}"
TDTYPE=$(python -c "from eaglewire.hw import native_bf16; print('bfloat16' if native_bf16() else 'float32')")
mkdir -p "$W"
[ -f "$W/vocab.safetensors" ] || eaglewire vocab build --data "$DATA" --limit "$LIMIT" --out "$W/vocab.safetensors" --draft-vocab-size "$VD"
eaglewire data capture --data "$DATA" --limit "$LIMIT" --out "$W/features" --target-dtype "$TDTYPE" --batch-size 8
SNAP="${SNAP:-4,12,35,110,330}"   # log-spaced, inside the first pass (334 steps of batch 8)
RESUME=""; [ -f "$W/train/checkpoints/latest" ] && RESUME="--resume"
eaglewire train --features "$W/features" --vocab "$W/vocab.safetensors" --out "$W/train" $RESUME \
  --max-steps "$STEPS" --batch-size 8 --ttt-steps 3 --lr 1e-3 --warmup-steps 20 --eval-every 50 --ckpt-every 50 \
  --snapshot-steps "$SNAP"
python -m benchmarks.recipe.scaling_curve "$W/train" --prompts 8 --max-new-tokens 128 --k 3 \
  --also src/eaglewire/assets/drafts/smollm2-135m --out "benchmarks/results/scaling/$(date +%F)-local"
echo "release with: python scripts/release_draft.py $W/train (reads $W/train/draft)"
