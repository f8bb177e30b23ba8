#!/usr/bin/env bash
# The "target-scored text" lever: ShareGPT's own answers (not regenerated), scored by the target at capture.
# Writes conversations [START, START+COUNT) of the sharegpt package (prompts the shipped regenerations do not
# use: they cover [0, 4995)) to the cache, then captures them with the release's taps and dtypes.
#   bash benchmarks/recipe/raw_text_features.sh [START] [COUNT] [OUT_DIR]
set -euo pipefail
START="${1:-5000}"; COUNT="${2:-1300}"
C="${EAGLEWIRE_CACHE:-$HOME/.cache/eaglewire}"
OUT="${3:-$C/raw-text/features}"
SLICE="$C/raw-text/sharegpt-$START-$COUNT.jsonl"
mkdir -p "$C/raw-text"
[ -f "$SLICE" ] || python - "$START" "$COUNT" "$SLICE" <<'PY'
import itertools, json, os, sys
from eaglewire.data.conversations import read_conversations
start, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with open(out + ".tmp", "w") as f:
    for c in itertools.islice(read_conversations("sharegpt"), start, start + count):
        f.write(json.dumps({"id": f"sharegpt-raw-{c.id}", "messages": c.messages()}) + "\n")
os.replace(out + ".tmp", out)
PY
TDTYPE=$(python -c "from eaglewire.hw import native_bf16; print('bfloat16' if native_bf16() else 'float32')")
eaglewire data capture --data "$SLICE" --out "$OUT" --target-dtype "$TDTYPE" --batch-size 8
