"""Ship a trained draft inside the package (bf16, strict native checkpoint) as the default for its target.

    python scripts/release_draft.py runs/standard      # a finished `eaglewire run` directory
    python scripts/release_draft.py WORK/train         # or an `eaglewire train --out` directory

Copies the run's draft (cast to bf16: half the size, no measurable change in tau here), its training
metrics and the run summary (config, data, held-out accuracy, benchmark) next to it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from eaglewire.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.verifier.loader import load_target

DEST = Path(__file__).parents[1] / "src/eaglewire/assets/drafts/smollm2-135m"


def main(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    if "draft" in summary:  # an `eaglewire run` directory
        draft_dir = Path(summary["draft"])
        keep = ("target", "taps", "wiring", "engine_ids", "config", "data", "vocab", "heldout", "bench", "verdict")
        summary = {k: summary[k] for k in keep}
    else:  # an `eaglewire train` directory: its summary is the training record
        draft_dir = run / "draft"
    draft = load_checkpoint(draft_dir, target=load_target(None))
    save_checkpoint(draft, draft.contract, DEST, dtype=torch.bfloat16)
    shutil.copyfile(draft_dir.parent / "metrics.jsonl", DEST / "metrics.jsonl")
    (DEST / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"released {draft_dir} -> {DEST} ({sum(f.stat().st_size for f in DEST.iterdir()) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
