"""Scoring and reporting for `peer_training.py`: every draft, whichever trainer made it, is loaded into
eaglewire's draft model and measured the same way (online chain tau on MT-bench with eaglewire's engine,
held-out teacher-forced top-1 per TTT position); the rows become a JSON, a table and a plot."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.serve.bench import bench_prompts
import eaglewire as ew
from eaglewire.decoding.tree import TreeShape
from eaglewire.export.convert import import_draft
from eaglewire.hw import describe_cpu

K = 3  # chain length scored (greedy, as vLLM's acceptance test)


class Scorer:
    """tau of a greedy k-chain on MT-bench first turns spread over the categories, two ways: offline for every
    draft (the answers eaglewire's engine decodes without a draft, decoded once, walked round by round as a
    decoder walks them: heldout_gap.py's tau_rounds, which reproduced the online bench within 0.01), and
    online (SpecDecoder, acceptance per position) where asked; plus held-out top-1 per TTT position."""

    def __init__(self, target, heldout: list, a: argparse.Namespace) -> None:
        from benchmarks.recipe.heldout_gap import bench_sample

        self.target, self.heldout, self.a = target, heldout, a
        self.dflash = getattr(a, "family", "eagle3") == "dflash"
        # [question + vanilla answer] each (EAGLE-3's offline walk; a block draft is scored online)
        self.answers = None if self.dflash else bench_sample(target, a.prompts, a.max_new_tokens)
        self.prompts = None

    def load(self, arm: str, run: Path):
        """The trained draft in eaglewire's model: native, or speculators' checkpoint through the vLLM import
        (taps given: they are the features' own, not re-measured). A DFlash draft of speculators': its
        DFlashSpeculator checkpoint through eaglewire's import of the vLLM/speculators block layout."""
        if arm == "speculators" and self.dflash:
            from eaglewire.export.block_import import import_block_draft

            draft, contract = import_block_draft(run / "draft", "vllm", family="dflash", target=self.target)
            want = self.a.contract.block
            if list(contract.taps) != list(self.a.taps) or (
                contract.block.block_size,
                contract.block.mask_token_id,
            ) != (want.block_size, want.mask_token_id):
                raise SystemExit(
                    f"speculators' DFlash checkpoint reads back with taps {contract.taps} and block "
                    f"{contract.block}; trained with {self.a.taps} and {self.a.contract.block}"
                )
            return draft.float()
        if arm == "speculators":
            draft, _ = import_draft(run / "draft", "vllm", target=self.target, taps=tuple(self.a.taps))
            draft.attach_embedding(self.target.embedding())
            return draft.float()
        return load_checkpoint(run / "draft", target=self.target).float()

    def online(self, draft) -> dict:
        """SpecDecoder with a greedy k-chain (a DFlash draft: its whole block, the family's shape) on the same
        questions: tau and acceptance per position."""
        if self.prompts is None:
            self.prompts = bench_prompts(self.target, "mtbench", self.a.prompts)  # the questions bench_sample asks
        if self.dflash:
            from eaglewire.compose import proposal_shape

            shape = proposal_shape(draft.contract, None)
        else:
            shape = TreeShape.chain(K)
        depth = shape.num_steps  # drafted tokens per round (num_draft_tokens counts the root too)
        st = ew.measure_tau(self.target, draft, self.prompts, shape, self.a.max_new_tokens)
        acc = st.accepted
        return {
            "tau_online": round(st.tau, 4),
            "per_position_online": [round(x, 4) for x in st.per_position(depth)],
            "verify_steps": len(acc),
        }

    def score(self, arm: str, run: Path, online: bool) -> dict:
        from benchmarks.recipe.heldout_gap import agreement

        draft = self.load(arm, run)
        if self.dflash:  # tau is the online one (the offline walk and held-out top-1 are EAGLE-3's TTT scores)
            on = self.online(draft)
            return {"tau": on["tau_online"], "chain_every_position": on["per_position_online"], **on}
        held = agreement(draft, self.target, self.heldout, K)
        bench = agreement(draft, self.target, self.answers, K)
        probe = run / "probe.safetensors"
        return {
            "import_check": import_check(draft, probe) if probe.exists() else None,
            "tau": bench["tau_rounds"],
            "rounds": bench["rounds"],
            "chain_every_position": bench["chain"],
            "heldout_top1": held["acc"],
            "heldout_tau_rounds": held["tau_rounds"],
            "norm": draft.cfg.norm.__dict__,
            **(self.online(draft) if online else {}),
        }


def write_results(rows: list[dict], a: argparse.Namespace) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    setup = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "contract"}
    (a.out / "peer_training.json").write_text(
        json.dumps({"cpu": describe_cpu(), "setup": setup, "rows": rows, "projections": projections(rows)}, indent=2)
        + "\n"
    )
    (a.out / "table.md").write_text(dflash_table(rows) if getattr(a, "family", "eagle3") == "dflash" else table(rows))
    plot(rows, a.out / "peer_training.png")


def table(rows: list[dict]) -> str:
    lines = [
        "| trainer | norms | budget | steps | trained tokens | tau (k=3) offline | chain acceptance per position "
        "(every anchor) | tau online | acceptance per position online | held-out top-1 per position | "
        "train tok/s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    f3 = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    for r in sorted(rows, key=lambda r: (r["budget"], r["arm"] != "speculators", r["arm"])):
        on = f"{r['tau_online']:.3f} | {f3(r['per_position_online'])}" if "tau_online" in r else "- | -"
        lines.append(
            f"| {r['arm']} | {r['norms']} | {r['budget']}x | {r['steps']} | {r['tokens']} | {r['tau']:.3f} | "
            f"{f3(r['chain_every_position'])} | {on} | {f3(r['heldout_top1'])} | {r['tok_per_s']:.0f} | "
            f"{r['peak_rss_mb']:.0f} |"
        )
    by = {(r["arm"], r["budget"]): r for r in rows}
    ratios = []
    for b in sorted({r["budget"] for r in rows}):
        peer = by.get(("speculators", b))
        ours = [r for r in rows if r["budget"] == b and r["arm"] != "speculators"]
        if peer and ours:
            ratios.append(
                f"- {b}x: "
                + "; ".join(
                    f"{r['arm']} tau {r['tau'] / peer['tau']:.3f}x, tokens/s {r['tok_per_s'] / peer['tok_per_s']:.2f}x"
                    for r in ours
                )
            )
    proj = [
        f"- {arm}: tau {p['tau_10x']:.3f} at {p['tokens_10x'] / 1e6:.2f} M tokens, {p['tau_100x']:.3f} at "
        f"{p['tokens_100x'] / 1e6:.1f} M (fit slope {p['per_doubling']:+.4f} tau per doubling)"
        for arm, p in projections(rows).items()
    ]
    return (
        "\n".join(
            lines
            + ["", "each eaglewire arm / speculators:"]
            + ratios
            + [
                "",
                "projection (not a measurement): tau - 1 fitted linear in ln(trained tokens) over each "
                "arm's budgets, at 10x and 100x its largest:",
            ]
            + proj
        )
        + "\n"
    )


def dflash_table(rows: list[dict]) -> str:
    """The DFlash comparison: tau and per-slot acceptance online (a whole block per round); train tok/s as the
    run measured it (shared cores)."""
    lines = [
        "| trainer | budget | steps | trained tokens | tau online | acceptance per slot online | train tok/s | "
        "peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["budget"], r["arm"] != "speculators")):
        per = " / ".join(f"{x:.3f}" for x in r["per_position_online"])
        lines.append(
            f"| {r['arm']} | {r['budget']}x | {r['steps']} | {r['tokens']} | {r['tau_online']:.3f} | {per} | "
            f"{r['tok_per_s']:.0f} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def projections(rows: list[dict]) -> dict[str, dict]:
    """Per arm with >= 3 budgets: least-squares fit of tau - 1 = a + b ln(tokens), evaluated at 10x and 100x
    the arm's largest trained-token count (a projection from a short curve, not a measurement)."""
    import math

    out = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        pts = [(math.log(r["tokens"]), r["tau"] - 1) for r in rows if r["arm"] == arm]
        if len(pts) < 3:
            continue
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        top = max(r["tokens"] for r in rows if r["arm"] == arm)
        at = lambda t: 1 + my + b * (math.log(t) - mx)  # noqa: E731
        out[arm] = {
            "tokens_10x": 10 * top,
            "tau_10x": round(at(10 * top), 4),
            "tokens_100x": 100 * top,
            "tau_100x": round(at(100 * top), 4),
            "per_doubling": round(b * math.log(2), 4),
        }
    return out


def plot(rows: list[dict], png: Path) -> None:
    """tau per arm against trained tokens (arms with one budget as markers: the levers), and tokens/s as the
    long run measured it (shared cores; the quiet figure is peer_throughput.py's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6))
    for arm in dict.fromkeys(r["arm"] for r in rows):
        pts = sorted((r["tokens"], r["tau"], r["tok_per_s"]) for r in rows if r["arm"] == arm)
        style = "o-" if len(pts) >= 3 else "x"
        label = f"{arm} ({next(r['norms'] for r in rows if r['arm'] == arm)})"
        ax1.semilogx([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax2.semilogx([p[0] for p in pts], [p[2] for p in pts], style, label=label)
    ax1.set(xlabel="trained tokens", ylabel=f"tau (chain k={K}, offline)", title="MT-bench first turns, greedy")
    ax2.set(
        xlabel="trained tokens",
        ylabel="training tokens/s (1 thread)",
        title="throughput in the long run (shared cores)",
    )
    ax1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


@torch.no_grad()
def import_check(draft, probe: Path) -> list[float]:
    """Per TTT step, the share of positions where the draft imported into eaglewire picks the same draft-vocab
    token as speculators' own forward did (peer_speculators_arm.py --probe): 1.0 everywhere means the import
    (and eaglewire's TTT inputs and mask) reproduce the trained model. Positions whose teacher-forced input
    ran past the sample's end are left out (speculators feeds padding there)."""
    from safetensors.torch import load_file

    from eaglewire.train.ttt import shift_left, ttt_attention_mask

    p = load_file(str(probe))
    ids, taps, want = p["input_ids"][None], p["hidden_states"][None].float(), p["tokens"]  # ids: x_{t+1} at t
    T = ids.shape[1]
    hidden, past, same = draft.fuse(taps), None, []
    for k in range(len(want)):
        out = draft.step(shift_left(ids, k), hidden, torch.arange(T)[None] + k, ttt_attention_mask(T, k), past)
        hidden, past = out.hidden, out.kv
        n = T - k
        same.append(round(float((out.logits[0, :n].argmax(-1) == want[k, :n]).float().mean()), 4))
    return same
