"""Training curves: loss (train and held-out) and per-TTT-position top-1 accuracy, as one PNG."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers or CI
import matplotlib.pyplot as plt  # noqa: E402


def _smooth(xs: list[float], k: int = 10) -> list[float]:
    out, acc = [], []
    for x in xs:
        acc = (acc + [x])[-k:]
        out.append(sum(acc) / len(acc))
    return out


def plot_metrics(metrics: Path, png: Path) -> Path:
    lines = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line]
    train = [r for r in lines if r["split"] == "train"]
    held = [r for r in lines if r["split"] == "heldout" and "acc" in r]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in train]
    ax_loss.plot(steps, _smooth([r["loss"] for r in train]), label="train (smoothed)")
    if held:
        ax_loss.plot([r["step"] for r in held], [r["loss"] for r in held], "o-", label="held-out")
    ax_loss.set(xlabel="step", ylabel="TTT loss (weighted sum over positions)", title="loss")
    ax_loss.legend()
    n_pos = len(train[0]["acc"]) if train else 0
    for k in range(n_pos):
        (line,) = ax_acc.plot(steps, _smooth([r["acc"][k] for r in train]), alpha=0.5)
        if held:
            ax_acc.plot(
                [r["step"] for r in held],
                [r["acc"][k] for r in held],
                "o-",
                color=line.get_color(),
                label=f"draft position {k + 1} (held-out)",
            )  # numbered as the report's acceptance plot
    ax_acc.set(xlabel="step", ylabel="top-1 accuracy", title="per-position accuracy (lines: train)", ylim=(0, 1))
    if held:
        ax_acc.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return Path(png)
