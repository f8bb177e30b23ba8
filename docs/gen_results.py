"""Generate the results pages' tables from benchmarks/results/index.json and the run files it lists (run by
docs/hooks.py before every build): a figure on a results page is read from its file, never retyped. The
pages' prose lives in docs/results/*.md and includes these tables (`--8<--` snippets)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = Path(__file__).parent / "results" / "generated"


def runs(topic: str | None = None) -> list[dict[str, Any]]:
    index = json.loads((RESULTS / "index.json").read_text())["runs"]
    return [r for r in index if topic is None or r["topic"] == topic]


def _head(r: dict[str, Any]) -> str:
    return (
        f"**{r['date']}, {r['machine']}, {r['dtype']}** — {r['what']}  \n"
        f"`{r['command']}`  \nfiles: `benchmarks/results/{r['path']}/`\n"
    )


def _img(r: dict[str, Any], name: str) -> str:
    src = RESULTS / r["path"] / name
    if not src.exists():
        return ""
    dst = OUT / "img" / r["path"].replace("/", "_") / name
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return f"\n![{r['what']}](generated/img/{r['path'].replace('/', '_')}/{name})\n"


def bench_table(r: dict[str, Any]) -> str:
    """The rows of an `eaglewire bench` run (bench.json)."""
    b = json.loads((RESULTS / r["path"] / "bench.json").read_text())
    lines = [
        _head(r),
        "| method | median tok/s | vs vanilla | vs vLLM vanilla | τ | per position | = vanilla |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in b["methods"].items():
        vs_vllm = f"{m['speedup_vs_vllm_vanilla']:.2f}×" if "speedup_vs_vllm_vanilla" in m else "–"
        pos = ", ".join(f"{p:.2f}" for p in m.get("per_position", [])) or "–"
        tau = f"{m['tau']:.2f}" if "tau" in m else "–"
        lines.append(
            f"| {name} | {m['median_tok_s']:.2f} | {m['speedup_vs_vanilla']:.2f}× | {vs_vllm} | {tau} | "
            f"{pos} | {m['matches_vanilla']}/{len(m.get('tok_s', [])) or '?'} |"
        )
    return "\n".join(lines) + "\n" + _img(r, "bench.png")


def verify_table(r: dict[str, Any]) -> str:
    """One target forward over N rows, as a multiple of a one-token decode step, per runtime layout."""
    v = json.loads((RESULTS / r["path"] / "verify.json").read_text())
    layouts = [k for k, x in v.items() if isinstance(x, dict) and "ratio_to_decode" in x]
    rows = list(v[layouts[0]]["ratio_to_decode"])
    lines = [_head(r), "| layout | " + " | ".join(f"{n} rows" for n in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for k in layouts:
        ms, ratio = v[k]["median_ms"], v[k]["ratio_to_decode"]
        lines.append(f"| {k} | " + " | ".join(f"{ms[n]:.1f} ms ({ratio[n]:.2f}×)" for n in rows) + " |")
    if "roofline" in v and "floor_ratio_to_decode" in v["roofline"]:
        floor = v["roofline"]["floor_ratio_to_decode"]
        cells = [f"{floor[n]:.2f}×" if n in floor else "–" for n in rows]
        lines.append("| roofline floor | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scaling_table(r: dict[str, Any]) -> str:
    s = json.loads((RESULTS / r["path"] / "scaling.json").read_text())
    lines = [_head(r), "| draft | step | trained tokens | τ | per position |", "|---|---|---|---|---|"]
    for row in s["rows"]:
        pos = ", ".join(f"{p:.2f}" for p in row.get("per_position", []))
        name = Path(str(row.get("draft", ""))).name
        lines.append(
            f"| {name} | {row.get('step', '–')} | {row.get('trained_tokens', '–')} | "
            f"{row.get('tau', float('nan')):.3f} | {pos} |"
        )
    return "\n".join(lines) + "\n" + _img(r, "scaling.png")


def runs_table() -> str:
    lines = ["| topic | date | machine | dtype | what | folder |", "|---|---|---|---|---|---|"]
    for r in runs():
        lines.append(f"| {r['topic']} | {r['date']} | {r['machine']} | {r['dtype']} | {r['what']} | `{r['path']}/` |")
    return "\n".join(lines) + "\n"


def generate() -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    pages = {
        "peer.md": "\n".join(bench_table(r) for r in runs("peer")),
        "quality.md": "\n".join(bench_table(r) for r in runs("quality")),
        "verify.md": "\n".join(verify_table(r) for r in runs("verify")),
        "scaling.md": "\n".join(scaling_table(r) for r in runs("scaling")),
        "runs.md": runs_table(),
    }
    written = []
    for name, text in pages.items():
        path = OUT / name
        path.write_text(text)
        written.append(path)
    for r in runs("doctor"):  # vllm_broken_exports.py writes its own table: included as written
        path = OUT / f"doctor-{r['date']}.md"
        path.write_text((RESULTS / r["path"] / "table.md").read_text())
        written.append(path)
    for r in runs("run"):  # the quick run's report pictures
        _img(r, "report-training.png"), _img(r, "report-bench.png")
    return written


if __name__ == "__main__":
    for p in generate():
        print(p)
