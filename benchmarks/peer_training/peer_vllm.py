"""`peer_training.py`'s drafts at one budget scored by real vLLM (its CPU build, `scripts/vllm_venv.sh`): each
served as vLLM's EAGLE-3 speculator (chain k=3, greedy, fp32, one request at a time) on the MT-bench questions
and token budget the other scores use; tau and per-position acceptance are vLLM's own counters (/metrics).
eaglewire's drafts are served from their `--format vllm` export, speculators' from the checkpoint its own
save_pretrained wrote. Beside each, the online tau eaglewire's engine measured for the same draft.

    python -m benchmarks.peer_training.peer_vllm --out benchmarks/results/peer_training/DATE-CPU --budget 10 \\
        --base-steps 16 --prompts 8 --max-new-tokens 128

Run it after peer_training.py with the same settings (it reads that run's drafts and rows).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from eaglewire.cache import cache_root
from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.export.convert import export_draft
from eaglewire.serve.bench import bench_prompts
from eaglewire.target.loader import load_target, resolve_target
from eaglewire.vllm_client.server import VllmServer, complete_ids, spec_metrics

from benchmarks.peer_training.peer_training import ARM_NORMS, run_key

K = 3


def serve_draft(target_dir: Path, draft_dir: Path, prompts: list[torch.Tensor], max_new: int) -> dict:
    """vLLM's counters after the prompts, one greedy request at a time, on a fresh server."""
    spec = {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": K}
    with VllmServer(target_dir, dtype="float32", speculative_config=spec, max_num_seqs=1) as srv:
        for p in prompts:
            complete_ids(srv.base_url, srv.model_name, p[0].tolist(), max_new)
        m = spec_metrics(srv.base_url)
    return {
        "tau_vllm": round(m["tau"], 4),
        "per_position_vllm": [round(x, 4) for x in m["per_position"]],
        "drafts_vllm": int(m["num_drafts"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=cache_root() / "peer_training")
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--arms", default="eaglewire,speculators,eaglewire_eagle31")
    ap.add_argument("--base-steps", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--ttt", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    target = load_target()
    target_dir = resolve_target(None)[1]
    prompts = bench_prompts(target, "mtbench", a.prompts)  # the questions peer_scoring asks
    rows = []
    for arm in a.arms.split(","):
        key = run_key(arm, a.budget, a)
        run = a.work / "runs" / key
        if not (run / "draft").is_dir():
            raise SystemExit(f"no trained draft at {run}: run peer_training.py with these settings first")
        ours = next(iter(sorted((a.work / "rows").glob(f"{key}-p{a.prompts}-n{a.max_new_tokens}-*online.json"))), None)
        row = {"arm": arm, "norms": ARM_NORMS[arm], "budget": a.budget}
        if ours is not None:
            r = json.loads(ours.read_text())
            row.update(tau_ours=r["tau_online"], per_position_ours=r["per_position_online"])
        with tempfile.TemporaryDirectory() as tmp:
            if arm == "speculators":
                draft_dir = run / "draft"  # as speculators' save_pretrained wrote it
            else:
                draft = load_checkpoint(run / "draft", target=target)
                draft_dir = export_draft(draft, draft.contract, Path(tmp) / "vllm", "vllm")
            row.update(serve_draft(target_dir, draft_dir, prompts, a.max_new_tokens))
        print(json.dumps(row), flush=True)
        rows.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"vllm-x{a.budget}.json").write_text(
        json.dumps({"setup": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
