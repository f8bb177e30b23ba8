#!/usr/bin/env bash
# How many conversations in flight regenerate fastest through vLLM's CPU build on this machine (issue 10:
# "say how many concurrent requests are best on 2 cores"). One `data regenerate --engine vllm` run per width,
# each on 3 x WIDTH fresh conversations (the rolling pool's drain at the end is then the same share of every
# run), first user turn only, greedy, 256 new tokens; the rate is the command's own (new tokens / generation
# seconds, server start excluded). Run it on a quiet machine: every figure is a throughput.
#   bash benchmarks/data/regen_concurrency.sh [OUT_DIR] [WIDTHS] [DTYPE]
#   RESERVED=default keeps vLLM's reserved scheduler core (its default on x86); by default both cores compute.
set -euo pipefail
OUT="${1:-${EAGLEWIRE_CACHE:-$HOME/.cache/eaglewire}/regen-concurrency}"
WIDTHS="${2:-8 16 32 64 128}"
DTYPE="${3:-bfloat16}"
cores="one core reserved for vLLM's scheduler"
[ "${RESERVED:-0}" = default ] || { export VLLM_CPU_NUM_OF_RESERVED_CPU=0; cores="both cores compute"; }
mkdir -p "$OUT"
start=0
for w in $WIDTHS; do
  n=$((3 * w))
  f="$OUT/w$w-$DTYPE.jsonl.gz"
  rm -f "$f" "$f.meta.json"  # a measurement, not data: never resume one
  # disjoint conversations per width (--start): no width gets prompts another already warmed the cache with
  line=$(eaglewire data regenerate --engine vllm --dtype "$DTYPE" --source sharegpt-parts --start "$start" \
         --limit "$n" --max-turns 1 --batch-size "$w" --out "$f" 2>/dev/null | grep "tok/s")
  echo "width $w ($DTYPE, $cores): $line"
  start=$((start + n))
done
