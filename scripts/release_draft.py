"""Ship a trained draft inside the package (bf16, strict native checkpoint) as the default for its target.

    python scripts/release_draft.py runs/standard      # a finished `eaglewire run` directory
    python scripts/release_draft.py WORK/train         # or an `eaglewire train --out` directory
    python scripts/release_draft.py WORK/train --checkpoint 550   # a run stopped early: its step-550 checkpoint

Copies the run's draft (cast to bf16: half the size, no measurable change in tau here), its training
metrics and the run summary (config, data, held-out accuracy, benchmark) next to it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.target.loader import load_target

DEST = Path(__file__).parents[1] / "src/eaglewire/assets/drafts/smollm2-135m"


def _checkpoint_summary(run: Path, step: int) -> tuple[Path, dict]:
    """A run stopped before max_steps (its time ran out): the checkpoint's draft, and a summary from
    its trainer state and the last held-out evaluation at or before that step, saying it was stopped."""
    ckpt = run / "checkpoints" / f"step-{step:06d}"
    state = json.loads((ckpt / "trainer.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    held = [r for r in rows if r["split"] == "heldout" and r["step"] <= step]
    summary = {
        "heldout": held[-1] if held else {},
        "stopped_at_step": step,
        "config": state["config"],
        "note": f"released from the step-{step} checkpoint of a {state['config']['max_steps']}-step schedule",
    }
    return ckpt / "draft", summary


def main(run: Path, checkpoint: int | None = None) -> None:
    if checkpoint is not None:
        draft_dir, summary = _checkpoint_summary(run, checkpoint)
        return _release(draft_dir, run / "metrics.jsonl", summary, upto=checkpoint)
    summary = json.loads((run / "summary.json").read_text())
    if "draft" in summary:  # an `eaglewire run` directory
        draft_dir = Path(summary["draft"])
        keep = ("target", "taps", "wiring", "engine_ids", "config", "data", "vocab", "heldout", "bench", "verdict")
        summary = {k: summary[k] for k in keep}
    else:  # an `eaglewire train` directory: its summary is the training record
        draft_dir = run / "draft"
    _release(draft_dir, draft_dir.parent / "metrics.jsonl", summary)


def _release(draft_dir: Path, metrics: Path, summary: dict, upto: int | None = None) -> None:
    draft = load_checkpoint(draft_dir, target=load_target(None))
    if summary.get("config", {}).get("init_from") and (DEST / "summary.json").exists():
        # a warm start continued the shipped draft: keep its record, so the provenance chains across releases
        summary["previous_release"] = json.loads((DEST / "summary.json").read_text())
    save_checkpoint(draft, draft.contract, DEST, dtype=torch.bfloat16)
    if upto is None:
        shutil.copyfile(metrics, DEST / "metrics.jsonl")
    else:  # the steps the released weights saw, not those a stopped run logged after its checkpoint
        lines = [line for line in metrics.read_text().splitlines() if line and json.loads(line)["step"] <= upto]
        (DEST / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    (DEST / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"released {draft_dir} -> {DEST} ({sum(f.stat().st_size for f in DEST.iterdir()) / 1e6:.1f} MB)")


if __name__ == "__main__":
    args = sys.argv[1:]
    step = int(args[args.index("--checkpoint") + 1]) if "--checkpoint" in args else None
    main(Path(args[0]), step)
