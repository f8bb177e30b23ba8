"""The budget presets of `eaglewire run` (--budget quick|standard|full): each a partial run config, applied
over the schema's defaults and under the --config file and the flags (pipeline/config.py resolve)."""

from __future__ import annotations

from typing import Any

from eaglewire.serve import bench_rows as B

# Budgets (README: measured times and tau). Each is a partial RunConfig. Their conversations are a contiguous
# prefix of ShareGPT that the shipped regeneration file covers (a resume: nothing is regenerated for the
# embedded target). quick is the newcomer's first run, sized to finish in ten minutes on 2 CPU cores: it
# continues the released draft's training (warm start, init_from "released") with a short, low-lr pass, TTT 3,
# on the first 96 conversations (the release already saw them: what the pass changes, if anything, is the
# report's tau before -> after, measured on the same prompts), and benchmarks the vLLM-style chain k=3 it is
# judged by at 256 new tokens (tau at 128 tokens reads ~0.1 lower for the same draft) on 4 spread MT-bench
# questions; standard trains from scratch on 292 conversations.
_QUICK: dict[str, Any] = {
    "data": {"conversations": 96},
    "vocab": {"draft_vocab_size": 8000},
    "train": {
        "max_steps": 40,
        "ttt_steps": 3,
        "lr": 2e-4,
        "warmup_steps": 5,
        "eval_every": 20,
        "ckpt_every": 20,
        "init_from": "released",
        "supervise": "all",
    },
    "bench": {"prompts": 4, "max_new_tokens": 256, "chain_k": 3, "methods": ("vanilla", "eagle_chain")},
}
BUDGETS: dict[str, dict[str, Any]] = {
    "quick": _QUICK,
    # the released draft: 292 conversations' features, 400 steps from scratch, issue-4 benchmark protocol
    "standard": {
        **_QUICK,
        "data": {"conversations": 292},
        "train": {
            "max_steps": 400,
            "ttt_steps": 3,
            "warmup_steps": 20,
            "eval_every": 50,
            "ckpt_every": 50,
            "supervise": "all",
        },
        "bench": {"prompts": 6, "max_new_tokens": 256, "methods": B.METHODS, "vllm": "auto"},
    },
    # hours of regeneration on a CPU (a GPU or `data regenerate --server` makes it practical)
    "full": {
        "data": {"conversations": 4000},
        "vocab": {"draft_vocab_size": 16000},
        "train": {"max_steps": 4000, "ttt_steps": 4, "eval_every": 250, "ckpt_every": 250},
        "bench": {"prompts": 80, "max_new_tokens": 256, "methods": B.METHODS, "vllm": "auto"},
    },
}
