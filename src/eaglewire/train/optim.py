"""The optimizer a run trains with (`TrainConfig.optimizer`).

- `adamw`: AdamW over every trained weight.
- `muon`: Muon (torch.optim.Muon: momentum, then the update orthogonalised by Newton-Schulz, its RMS matched to
  AdamW's so one lr schedule drives both) over the draft's hidden matrices (fc, attention, MLP), and AdamW over
  the rest: the vocabulary-sized head and the norm weights, as Muon's authors and speculators do (a head row is
  a token's own direction, not a mixing matrix to orthogonalise).

Both are one object with AdamW's interface to the loop and to train/state.py: `param_groups` (the loop sets each
group's lr), `zero_grad`, `step`, and a state dict indexed by position in the run's parameter list, so saving
and resuming work unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

OPTIMIZERS = ("adamw", "muon")
_ADAMW_ONLY = ("lm_head", "embed_tokens")  # vocabulary-sized matrices: AdamW under `muon` too


def uses_muon(name: str, p: torch.Tensor) -> bool:
    """Whether `muon` updates this weight with Muon: a real matrix (both sides > 1) that is not vocabulary-sized."""
    return p.ndim == 2 and min(p.shape) > 1 and not name.startswith(_ADAMW_ONLY)


class Optimizers:
    """Optimizers over disjoint parts of one parameter list, stepped together; their state dict is indexed as
    a single optimizer over the whole list would index it."""

    def __init__(self, parts: list[tuple[torch.optim.Optimizer, list[int]]]) -> None:
        self.parts = parts  # (optimizer, the list positions of its parameters, in its own order)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt, _ in self.parts for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt, _ in self.parts:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt, _ in self.parts:
            opt.step()

    def state_dict(self) -> dict[str, Any]:
        state, groups = {}, []
        for opt, where in self.parts:
            sd = opt.state_dict()
            state.update({where[i]: st for i, st in sd["state"].items()})
            groups += [{**g, "params": [where[i] for i in g["params"]]} for g in sd["param_groups"]]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        groups, k = sd["param_groups"], 0
        for opt, where in self.parts:
            mine, k = groups[k : k + len(opt.param_groups)], k + len(opt.param_groups)
            local = {g: i for i, g in enumerate(where)}
            opt.load_state_dict(
                {
                    "state": {local[g]: st for g, st in sd["state"].items() if g in local},
                    "param_groups": [{**g, "params": [local[p] for p in g["params"]]} for g in mine],
                }
            )
        if k != len(groups):
            raise ValueError(f"{len(groups)} saved param groups for {k} in this run's optimizers")


def build_optimizer(
    named: list[tuple[str, torch.Tensor]], kind: str, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.Optimizer | Optimizers:
    """The run's optimizer over its trained parameters `named` (in the order the state is indexed by)."""
    params = [p for _, p in named]
    adamw = dict(lr=lr, betas=betas, weight_decay=weight_decay, eps=1e-8)
    if kind == "adamw":
        return torch.optim.AdamW(params, **adamw)
    if kind != "muon":
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {kind!r}")
    muon = [i for i, (n, p) in enumerate(named) if uses_muon(n, p)]
    rest = sorted(set(range(len(named))) - set(muon))
    parts: list[tuple[torch.optim.Optimizer, list[int]]] = []
    if muon:
        parts.append(
            (
                torch.optim.Muon(
                    [params[i] for i in muon], lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"
                ),
                muon,
            )
        )
    if rest:
        parts.append((torch.optim.AdamW([params[i] for i in rest], **adamw), rest))
    return Optimizers(parts)
