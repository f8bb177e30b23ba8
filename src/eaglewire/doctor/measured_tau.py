"""The measured wiring check's τ under the engine's own knobs: our speculative engine run on the target.

The teacher-forced chain (trained_taps.chain) predicts a greedy chain only: a tree (SGLang topk > 1) accepts
along whichever branch matches, which no teacher-forced score gives. So for a tree shape (or a chain
asked for by its knobs) the check runs OUR engine — decoding.engine.SpecDecoder with
decoding.propose.EagleProposer, the very code `doctor expect` predicts with (doctor.expect.predict) —
greedy on the built-in prompts, once per tap set, with the draft's weights unchanged and a contract
whose taps are that set. EagleProposer takes its taps from the contract it is given (`self.taps =
contract.taps`) and SpecDecoder asks the target for exactly those boundaries at prefill and at every
verify forward, so the draft is fed the delivered boundaries as the engine would feed them.

Cost: one speculative generation per distinct tap set (the healthy case, delivered = best, runs once)
of 8 built-in prompts x ENGINE_NEW_TOKENS tokens: several times the whole teacher-forced measurement
(the draft's Python tree building dominates on a small target). Hence only on request (the engine's
knobs), not on every check.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from eaglewire.contract import WiringContract
from eaglewire.decoding.tree import TreeShape
from eaglewire.capture.boundaries import builtin_prompts
from eaglewire.target.loader import Target

ENGINE_NEW_TOKENS = 64  # greedy tokens per built-in prompt: 8 x 64 ~ 330 verify rounds at τ ~1.5
Taps = tuple[int, ...]


def engine_prompts(target: Target) -> list[torch.Tensor]:
    """The doctor's built-in prompts as [1, P] batches, the layout SpecDecoder.generate takes."""
    return [p[None] for p in builtin_prompts(target)]


def knobs(shape: TreeShape) -> str:
    """The shape in the engines' own spelling (what the user launches with)."""
    sglang = (
        f"SGLang --speculative-num-steps {shape.num_steps} --speculative-eagle-topk {shape.topk} "
        f"--speculative-num-draft-tokens {shape.num_draft_tokens}"
    )
    return f"vLLM num_speculative_tokens={shape.num_steps} = {sglang}" if shape.is_chain else sglang


@dataclass
class EngineRun:
    """Our engine's τ per tap set at one shape. tau[name] None: the engine cannot capture that set."""

    shape: TreeShape
    prompts: int
    new_tokens: int
    tau: dict[str, tuple[float, list[float]] | None] = field(default_factory=dict)  # tau, per-position acceptance
    skipped: str = ""  # why the engine was not run at all (then tau is empty)

    def to_dict(self) -> dict[str, object]:
        """Entries for Measurement.to_dict's tau: "<name>_engine" each, with the shape and the prompts."""
        if self.skipped:
            return {"delivered_engine": None, "best_engine": None, "engine_skipped": self.skipped}
        shape = {
            "num_steps": self.shape.num_steps,
            "topk": self.shape.topk,
            "num_draft_tokens": self.shape.num_draft_tokens,
        }
        return {
            f"{name}_engine": None
            if v is None
            else {
                "tau": round(v[0], 3),
                "per_position": [round(x, 3) for x in v[1]],
                "shape": shape,
                "prompts": self.prompts,
                "new_tokens": self.new_tokens,
            }
            for name, v in self.tau.items()
        }

    def text(self) -> str:
        """The finding's sentence: which knobs, on what, the τ of each set."""
        head = f"; our engine at {knobs(self.shape)}"
        if self.skipped:
            return f"{head}: not run ({self.skipped})"
        parts = [
            f"{name} {v[0]:.2f}" if v is not None else f"{name}: none (the engine cannot capture it)"
            for name, v in sorted(self.tau.items())
        ]
        return (
            f"{head} ({self.prompts} built-in prompts x {self.new_tokens} greedy tokens) predicts tau (doctor's engine) "
            + ", ".join(parts)
        )


def run_engine(
    target: Target,
    draft: Any,
    contract: WiringContract,
    shape: TreeShape,
    sets: dict[str, Taps | None],
    new_tokens: int = ENGINE_NEW_TOKENS,
) -> EngineRun:
    """Our engine on the target once per distinct tap set in `sets` (name -> boundaries, None = cannot be
    captured), the draft fed that set: `contract` with its taps replaced (its vocab map, norm flags and
    target stay the draft's)."""
    from eaglewire.doctor.expect import predict  # the oracle's own runner: the same numbers `doctor expect` gives

    prompts = engine_prompts(target)
    run, done = EngineRun(shape, len(prompts), new_tokens), {}
    for name, taps in sets.items():
        if taps is not None and taps not in done:
            done[taps] = predict(target, draft, replace(contract, taps=taps), shape, prompts, new_tokens)
        run.tau[name] = done[taps] if taps is not None else None
    return run
