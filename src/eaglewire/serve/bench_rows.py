"""The benchmark's row names and defaults: the rows on our runtime, the block drafter's, the rows speedups are
quoted against, and the defaults `eaglewire bench` and the run config's bench section share (defined here only).
Which rows decode with which family's draft is each family's record's (serve/bench.py registers them)."""

from __future__ import annotations

METHODS = ("hf_generate", "vanilla", "prompt_lookup", "eagle_chain", "eagle_tree")  # on our runtime
# Defaults of `eaglewire bench` and of the run config's bench section (defined here only; the tree is
# decoding/tree.py's DEFAULT_TREE). A chain of 1: on a CPU a verify of 1-3 tokens costs about one decode step.
QUESTIONS, PROMPTS, MAX_NEW_TOKENS = "mtbench", 8, 128
CHAIN_K = 1
# `eaglewire run`'s bench rows by default: HF generate is opt-in there (it is the slowest row to time)
DEFAULT_METHODS = ("vanilla", "prompt_lookup", "eagle_chain", "eagle_tree")
# Rows that decode with a block drafter (`--dflash-draft`): its whole block per round (decoding/block.py)
BLOCK_METHODS = ("dflash",)
BASES = ("hf_generate", "vanilla", "prompt_lookup", "vllm_vanilla", "llamacpp_vanilla")  # speedups quoted against
PEER_BASES = {"vllm_": "vllm_vanilla", "llamacpp_": "llamacpp_vanilla"}  # a peer row's own engine's plain row
# the (ours, peer) row pairs each repetition compares on the same prompts
PEER_PAIRS = (
    ("eagle_chain", "vllm_eagle_chain"),
    ("vanilla", "vllm_vanilla"),  # ours, the peer's same row
    ("eagle_chain", "llamacpp_eagle_chain"),
    ("vanilla", "llamacpp_vanilla"),
)
