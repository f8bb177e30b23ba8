"""The README's lead picture: each broken export of the released draft, the τ real vLLM served it at, and
what `eaglewire doctor` said about it before it was served. Drawn from a committed run of
benchmarks/doctor/vllm_broken_exports.py (its cases.json); nothing is measured here.

    python -m benchmarks.doctor.doctor_figure benchmarks/results/doctor/2026-12-03-epyc-avx512-fp32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(cases: dict) -> list[tuple[str, float | None, str, str]]:
    """(case, τ in vLLM or None, what vLLM did, the doctor's verdict) per case, in the file's order."""
    out = []
    for key, c in cases.items():
        if key.startswith("_"):
            continue
        doc = c["doctor_with_contract"]
        verdict = "doctor: clean" if not doc["errors"] else f"doctor: {', '.join(doc['checks'])} error"
        out.append((c["case"], c.get("tau"), c["vllm"], verdict))
    return out


def draw(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = json.loads((run_dir / "cases.json").read_text())
    meta, data = cases["_meta"], rows(cases)
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(data) + 1.4))
    for i, (case, tau, vllm, verdict) in enumerate(data):
        ok = verdict == "doctor: clean"
        colour = "#4c9a2a" if ok else "#c0392b"
        if tau is not None:
            ax.barh(i, tau - 1, left=1, color=colour, height=0.6)
            ax.text(
                tau + 0.02,
                i,
                f"τ {tau:.2f} · {verdict}",
                va="center",
                fontsize=9,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
        else:
            ax.text(1.02, i, f"vLLM {vllm} · {verdict}", va="center", fontsize=9, color=colour)
    ax.axvline(meta["predicted_tau"], color="grey", ls="--", lw=1)
    ax.set_yticks(range(len(data)), [d[0] for d in data], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(1, meta["predicted_tau"] + 0.9)
    ax.set_xlabel(
        f"acceptance length τ in vLLM's CPU build (chain k={meta['k']}, {meta['prompts']} MT-bench "
        f"prompts)\ndashed: our engine's prediction for the healthy export, {meta['predicted_tau']:.2f}",
        fontsize=9,
    )
    ax.set_title(
        "One draft exported broken ten ways: the τ vLLM served it at, and what the doctor said before", fontsize=10
    )
    fig.tight_layout()
    out = run_dir / "doctor.png"
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    print(draw(p.parse_args().run_dir))
