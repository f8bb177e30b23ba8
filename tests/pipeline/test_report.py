"""The run report says what it was measured on, and its two per-position pictures number positions alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire import __version__
from eaglewire.pipeline import render, report


def test_header_names_the_machine_and_the_version() -> None:
    m = report.machine()
    assert m["eaglewire"] == __version__ and m["cores"] >= 1 and m["cpu"] and m["isa"]
    line = report.machine_line(m)
    assert f"eaglewire {__version__}" in line and f"{m['cores']} cores" in line and m["isa"] in line
    html = render.html_page("t", [], line)
    assert "class='machine'" in html and f"eaglewire {__version__}" in html


def test_a_capped_isa_is_named_and_amx_is_not_claimed_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from eaglewire import hw

    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert hw.amx_usable() and "AMX" in report.machine()["isa"]
    for cap, amx in (("AVX512_CORE_BF16", False), ("AVX2", False), ("AVX512_CORE_AMX", True), ("ALL", True)):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        isa = report.machine()["isa"]
        assert hw.amx_usable() is amx and (", AMX" in isa) is amx and f"ONEDNN_MAX_CPU_ISA={cap}" in isa, (cap, isa)
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert not hw.amx_usable() and "AMX" not in report.machine()["isa"]


def test_per_position_plot_has_integer_draft_positions(tmp_path: Path) -> None:
    result = {
        "methods": {
            "vanilla": {"median_tok_s": 10.0},
            "eagle_chain": {"per_position": [0.5, 0.25, 0.125], "median_tok_s": 12.0},
        },
        "chain": {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "tree": {"num_steps": 2, "topk": 2, "num_draft_tokens": 3},
    }
    fig = report.per_position_figure(result)
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1, 2, 3] and ax.get_xlabel() == "draft position"
    assert report.per_position_png(result, tmp_path / "p.png").stat().st_size > 1000


def test_training_plot_numbers_positions_from_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eaglewire.train import plot

    rows = [{"split": "train", "step": s, "loss": 1.0 / s, "acc": [0.5, 0.4, 0.3]} for s in range(1, 4)]
    rows.append({"split": "heldout", "step": 3, "loss": 0.4, "acc": [0.5, 0.4, 0.3]})
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    figs = []
    monkeypatch.setattr(plot.plt, "close", figs.append)
    plot.plot_metrics(tmp_path / "m.jsonl", tmp_path / "t.png")
    labels = [t.get_text() for t in figs[0].axes[1].get_legend().get_texts()]
    assert labels == [f"draft position {k} (held-out)" for k in (1, 2, 3)]
