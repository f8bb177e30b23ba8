"""The run report: OUT/summary.json (machine-readable), OUT/report.md and a self-contained
OUT/report.html (pictures inlined as PNG data URIs; no scripts, no external files).

Both documents are rendered from the same list of sections (title, paragraphs, tables, images), so
they can never disagree.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglewire import hw
from eaglewire.about import __version__
from eaglewire.contract import WiringContract, describe_boundary, to_engine
from eaglewire.errors import TranslationError
from eaglewire.export.engines import engine_for
from eaglewire.families import Family, get_family
from eaglewire.pipeline.stages import Ctx, copy_into
from eaglewire.safeio import atomic_write_json, atomic_write_text

ENGINE_IDS = ("sglang", "vllm")


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)  # paragraphs (plain text)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    images: list[tuple[str, Path]] = field(default_factory=list)  # (caption, png)
    code: list[str] = field(default_factory=list)


def wiring_words(ctx: Ctx) -> tuple[str, dict[str, list[int] | str]]:
    """'the draft reads the outputs of decoder layers 1, 14 and 26 of X' + each engine's ids."""
    L, taps = ctx.target.num_layers, ctx.contract.taps
    parts = [describe_boundary(b, L) for b in taps]
    layers = [p.removeprefix("output of decoder layer ") for p in parts]
    if all(p.startswith("output of decoder layer") for p in parts):
        said = ", ".join(layers[:-1]) + f" and {layers[-1]}" if len(layers) > 1 else layers[0]
        words = f"the draft reads the outputs of decoder layers {said} (0-based) of {ctx.target.name}"
    else:
        words = f"the draft reads: {'; '.join(parts)} of {ctx.target.name}"
    ids: dict[str, list[int] | str] = {}
    arch, fam = ctx.contract.target.architecture, family(ctx)
    for eng in ENGINE_IDS:
        try:  # a family with engine fields of its own (a block drafter) numbers its taps by them, else the engine's
            conv = engine_for(eng, family=fam.name).convention_for(arch, fam.name)
            ids[eng] = list(to_engine(taps, conv, L))
        except TranslationError as err:
            ids[eng] = f"not expressible: {err.what}"
    return words, ids


def family(ctx: Ctx) -> Family:
    """The record of the family the run trained (families.py)."""
    return get_family(ctx.cfg.family.name)


def trained_contract(ctx: Ctx) -> WiringContract:
    return WiringContract.from_dict(ctx.results["train"]["contract"])


def launch_commands(ctx: Ctx) -> dict[str, str]:
    """Engine launch lines for the exports, with the knobs the benchmark measured (a block drafter: its block)."""
    b, exports, fam = ctx.cfg.bench, ctx.results["export"]["exports"], family(ctx)
    target = str(ctx.target.path) if ctx.target.path else ctx.target.name
    block = trained_contract(ctx).block
    # SGLang's block-size flag counts the anchor (B); vLLM's num_speculative_tokens counts the drafts of a round
    # EAGLE-3: the shape the bench ran, the tree where its row ran, else the chain (as SGLang spells a chain)
    ran = ctx.results.get("bench", {}).get("result", {}).get("methods", {})
    shape = b.tree() if "eagle_tree" in ran else b.chain()
    sglang_knobs = (
        [f"--speculative-num-draft-tokens {block.block_size}"]
        if block
        else [
            f"--speculative-num-steps {shape.num_steps}",
            f"--speculative-eagle-topk {shape.topk}",
            f"--speculative-num-draft-tokens {shape.num_draft_tokens}",
        ]
    )
    out = {}
    if "sglang" in exports:
        try:  # the layer ids in the export were written for one SGLang release's model-file rule
            rule = f"# layer ids written for {engine_for('sglang').rule_note(ctx.contract.target.architecture)}\n"
        except TranslationError as err:
            rule = f"# {err.what}\n"
        out["sglang"] = rule + " ".join(
            [
                "python -m sglang.launch_server",
                f"--model-path {shlex.quote(target)}",
                f"--speculative-algorithm {fam.sglang_algorithm}",
                f"--speculative-draft-model-path {shlex.quote(exports['sglang'])}",
                *sglang_knobs,
                "--dtype float32",
            ]
        )
    if "vllm" in exports:
        spec = json.dumps(
            {
                "method": fam.vllm_method,
                "model": exports["vllm"],
                "num_speculative_tokens": block.drafts_per_round if block else b.chain_k,
            }
        )
        out["vllm"] = f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(spec)} --dtype float32"
    if "llamacpp" in exports or ("vllm" in exports and not block):
        out["llamacpp"] = _llamacpp_line(ctx, exports, block.drafts_per_round if block else b.chain_k)
    return out


def _llamacpp_line(ctx: Ctx, exports: dict[str, str], n_max: int) -> str:
    """llama-server's line: the GGUF export when the run wrote one, else llama.cpp's converter on the vLLM export
    first (an EAGLE-3 draft; llama.cpp's own converter reads the vLLM layout's top-level ids)."""
    from eaglewire.serve.llamacpp import server_line
    from eaglewire.target.loader import embedded_gguf_path, embedded_key

    spec_type = family(ctx).llamacpp_spec_type
    key = embedded_key(ctx.target.path)
    gguf = "TARGET.gguf" if key is None else shlex.quote(str(embedded_gguf_path(key)))
    if "llamacpp" in exports:
        return server_line(gguf, shlex.quote(exports["llamacpp"]), spec_type, n_max)
    target = shlex.quote(str(ctx.target.path)) if ctx.target.path else "TARGET_HF_DIR"
    return (
        f"# the GGUF draft: llama.cpp's converter on the vLLM export\npython convert_hf_to_gguf.py "
        f"{shlex.quote(exports['vllm'])} --target-model-dir {target} --outfile draft.gguf --outtype f32\n"
        + server_line(gguf, "draft.gguf", spec_type, n_max)
    )


def _block_words(contract: WiringContract) -> str:
    """', block size 8 (7 drafts per pass), mask token 2' for a block drafter, '' otherwise."""
    b = contract.block
    return (
        ""
        if b is None
        else (
            f", block size {b.block_size} ({b.drafts_per_round} drafts per pass, anchor layout "
            f"{b.anchor_layout}), mask token {b.mask_token_id}, RoPE {b.rope_style}"
        )
    )


def _bench_rows(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    from eaglewire.serve.bench_summary import label

    bases = [
        b
        for b in ("vanilla", "prompt_lookup", "hf_generate", "vllm_vanilla", "llamacpp_vanilla")
        if b in res["methods"]
    ]
    head = (
        ["method", "median tok/s"] + [f"× {b}" for b in bases] + ["τ (bench)", "per-position acceptance", "= vanilla"]
    )
    rows = []
    for name, m in res["methods"].items():
        rows.append(
            [label(name, res), f"{m['median_tok_s']:.2f}"]
            + [f"{m[f'speedup_vs_{b}']:.2f}×" for b in bases]
            + [
                f"{m['tau']:.2f}" if "tau" in m else "–",
                ", ".join(f"{p:.2f}" for p in m.get("per_position", [])) or "–",
                f"{m['matches_vanilla']}/{res['prompts']}",
            ]
        )
    return head, rows


def tau_change(res: dict[str, Any]) -> str:
    """'Training started from X: τ 1.97 -> 2.01 ...' (bench.tau_prompts), or '' where it was not measured."""
    t = res.get("tau_before_after")
    if not t:
        return ""
    return (
        f"Training started from {t['start']}: τ (bench) {t['before']:.2f} before -> {t['after']:.2f} after "
        f"(chain k = {t['chain_k']}, the same {t['prompts']} prompts × {t['max_new_tokens']} new tokens, "
        "float32 drafts on the plain runtime)."
    )


def verdict(res: dict[str, Any], family: str = "eagle3") -> str:
    from eaglewire.serve.bench import family_rows
    from eaglewire.serve.bench_summary import label
    from eaglewire.serve.llamacpp_peer import LLAMACPP_METHODS
    from eaglewire.serve.peer import PEER_METHODS

    m = res["methods"]
    engines = PEER_METHODS + LLAMACPP_METHODS  # another engine's rows: quoted beside ours, never as our best
    best = max((n for n in m if n in family_rows()[family] and n not in engines), key=lambda n: m[n]["median_tok_s"])
    r = m[best]["speedup_vs_vanilla"]
    word = "faster" if r > 1 else "slower"
    return (
        f"Best {get_family(family).title} setting: {label(best, res)} at {m[best]['median_tok_s']:.2f} tok/s = {r:.2f}× the "
        f"tokens/s of vanilla decoding ({word}), τ (bench) {m[best]['tau']:.2f}"
        + (f", {m[best]['speedup_vs_prompt_lookup']:.2f}× prompt lookup" if "prompt_lookup" in m else "")
        + "."
        + (
            f" The real vLLM CPU build with the same draft: {label('vllm_eagle_chain', res)} "
            f"{m['vllm_eagle_chain']['median_tok_s']:.2f} tok/s ({m['vllm_eagle_chain']['speedup_vs_vllm_vanilla']:.2f}× "
            f"its vanilla, τ {m['vllm_eagle_chain']['tau']:.2f}); ours is "
            f"{m[best]['speedup_vs_vllm_vanilla'] / m['vllm_eagle_chain']['speedup_vs_vllm_vanilla']:.2f}× its tok/s."
            if "vllm_eagle_chain" in m and "vllm_vanilla" in m
            else ""
        )
        + _llamacpp_words(res)
        + (" " + tau_change(res) if tau_change(res) else "")
    )


def _llamacpp_words(res: dict[str, Any]) -> str:
    """llama.cpp's measured tau and speed with the draft, against llama.cpp alone ('' without its rows)."""
    from eaglewire.serve.bench_summary import label

    m = res["methods"]
    if "llamacpp_eagle_chain" not in m or "llamacpp_vanilla" not in m:
        return ""
    r = m["llamacpp_eagle_chain"]
    same = (
        f"; {r['matches_llamacpp_vanilla']}/{len(r['tok_s'])} answers equal its own plain ones"
        if "matches_llamacpp_vanilla" in r
        else ""
    )
    return (
        f" llama.cpp with the same draft, {label('llamacpp_eagle_chain', res)}: τ {r['tau']:.2f}, "
        f"{r['median_tok_s']:.2f} tok/s = {r['speedup_vs_llamacpp_vanilla']:.2f}× llama.cpp alone "
        f"({m['llamacpp_vanilla']['median_tok_s']:.2f} tok/s){same}."
    )


def _sections(ctx: Ctx, timings: dict[str, dict[str, Any]], pngs: dict[str, Path]) -> list[Section]:
    r, cfg = ctx.results, ctx.cfg
    words, ids = wiring_words(ctx)
    sec = [
        Section(
            "Wiring contract",
            [
                f"{words[0].upper()}{words[1:]}: residual-stream boundaries {list(ctx.contract.taps)} of "
                f"{ctx.target.num_layers} layers (hidden {ctx.target.hidden_size}, so fc reads "
                f"{len(ctx.contract.taps)}×{ctx.target.hidden_size} = {len(ctx.contract.taps) * ctx.target.hidden_size}).",
                "; ".join(f"{e} ids {v}" for e, v in ids.items()) + ".",
                (
                    f"Draft vocabulary {cfg.vocab.draft_vocab_size} of {ctx.target.vocab_size} tokens "
                    f"(vocab map {r['vocab']['sha256'][:16]})"
                    if trained_contract(ctx).vocab_map_sha256
                    else f"The draft predicts the target's full vocabulary ({ctx.target.vocab_size} tokens)"
                )
                + f"; {family(ctx).title} draft{_block_words(trained_contract(ctx))}; contract fingerprint "
                f"{WiringContract.from_dict(r['train']['contract']).fingerprint()} (eaglewire_contract.json in every export).",
            ],
        )
    ]
    v = r["vocab"]
    sec.append(
        Section(
            "Data",
            [
                f"{r['regenerate']['conversations']} conversations from {cfg.data.source} answered by the target "
                f"(its regeneration file holds {r['regenerate']['in_file']}, {r['regenerate']['from_shipped']} of them "
                f"from the shipped data; {r['regenerate']['new_tokens_this_run']} tokens generated in this run); "
                f"{v['samples']} samples, "
                f"{v['tokens']} tokens, {v['trained_tokens']} trained (assistant) tokens.",
                "Vocab coverage: "
                + ", ".join(f"{k} {c:.2%}" for k, c in v["coverage"].items())
                + f" of trained tokens ({v['distinct_trained_tokens']} distinct).",
            ],
        )
    )
    h = r["train"]["heldout"]
    objective = (
        f"block {cfg.family.block_size}, {cfg.family.anchors} anchors per sequence"
        if trained_contract(ctx).block
        else f"TTT {cfg.train.ttt_steps} steps"
    )
    sec.append(
        Section(
            "Training",
            [
                f"{family(ctx).title}: {cfg.train.max_steps} steps, batch {cfg.train.batch_size}, {objective}, lr {cfg.train.lr}, "
                f"features {cfg.train.features}; {r['train']['train_samples']} training / {r['train']['heldout_samples']} "
                f"held-out samples.",
                "Held-out top-1 accuracy per draft position: " + ", ".join(f"{a:.3f}" for a in h.get("acc", [])),
            ]
            + [p for p in [tau_change(r["bench"]["result"])] if p],
            images=[("loss and per-position accuracy", pngs["training"])],
        )
    )
    reps = r["doctor"]["reports"]
    rows = [[f["level"], fmt, f["check"], f["what"], f["fix"]] for fmt, rep in reps.items() for f in rep["findings"]]
    sec.append(
        Section(
            "Doctor",
            [
                f"{r['doctor']['errors']} error(s): "
                + "; ".join(
                    f"{fmt} export ({rep['directory']}) checked as {rep['engine']}: {rep['errors']} error(s), "
                    f"{len(rep['findings'])} finding(s)"
                    for fmt, rep in reps.items()
                )
                + "."
            ],
            tables=[(["level", "export", "check", "what", "fix"], rows)] if rows else [],
        )
    )
    res = r["bench"]["result"]
    sec.append(
        Section(
            "Benchmark",
            [
                f"{res['prompts']} prompts from {res['questions']} (first turns), {res['max_new_tokens']} new tokens, greedy, "
                "one process, methods interleaved, medians; every method's tokens are compared with vanilla's.",
                verdict(res, cfg.family.name),
            ],
            tables=[_bench_rows(res)],
            images=[("per-position acceptance (draft position 1, 2, 3 as in the training plot)", pngs["bench"])],
        )
    )
    sec.append(
        Section(
            "Deploy",
            [
                "Launch commands with the exported drafts and the benchmark's knobs "
                "(check first: eaglewire doctor DIR --engine sglang|vllm). On a GPU a verify "
                "of many tokens costs about one decode step, so deeper knobs pay off there; "
                "eaglewire doctor expect --draft DIR predicts τ for any knobs."
            ],
            code=list(launch_commands(ctx).values()),
        )
    )
    ran = sum(t["seconds"] for t in timings.values() if not t["reused"])
    kept = [n for n, t in timings.items() if t["reused"]]
    sec.append(
        Section(
            "Stages",
            [
                f"Command: {ctx.command or 'eaglewire run'}. Total: "
                f"{sum(t['seconds'] for t in timings.values()):.0f} s over every stage, {ran:.0f} s "
                "in this invocation" + (f" ({len(kept)} stage(s) kept from an earlier run)" if kept else "") + "."
            ],
            tables=[
                (
                    ["stage", "seconds", "status", "directory"],
                    [
                        [n, f"{t['seconds']:.0f}", "kept from earlier run" if t["reused"] else "ran", t["dir"]]
                        for n, t in timings.items()
                    ],
                )
            ],
        )
    )
    return sec


def machine() -> dict[str, Any]:
    """What the report's figures were measured on (CPU, ISA, cores) and with which eaglewire: a number in the
    report means little without them."""
    cpu = hw.describe_cpu()
    caps = "".join(f", {k}={v}" for k, v in cpu["isa_caps"].items())  # a capped run must say so
    isa = (
        str(cpu["torch_capability"])
        + (", native bf16" if cpu["native_bf16"] else "")
        + (", AMX" if hw.amx_usable() else "")
        + caps
    )
    return {
        "cpu": cpu["model"],
        "isa": isa,
        "cores": os.cpu_count(),
        "threads": cpu["threads"],
        "eaglewire": __version__,
    }


def machine_line(m: dict[str, Any]) -> str:
    return f"eaglewire {m['eaglewire']} · {m['cpu']} · {m['isa']} · {m['cores']} cores ({m['threads']} torch threads)"


def per_position_figure(result: dict[str, Any]) -> Any:
    """Per-position acceptance of the EAGLE rows, numbered like the training plot's positions (draft position
    1, 2, 3, integer ticks), so the two pictures of the report read the same way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eaglewire.serve.bench_summary import label

    fig, ax = plt.subplots(figsize=(7, 4))
    depth = 0
    for name, m in result["methods"].items():
        pp = m.get("per_position") or []
        if pp:
            ax.plot(range(1, len(pp) + 1), pp, "o-", label=label(name, result))
            depth = max(depth, len(pp))
    ax.set_xticks(range(1, depth + 1))
    ax.set(
        xlabel="draft position",
        ylabel="accepted at this position / verify steps",
        ylim=(0, 1),
        title="per-position acceptance",
    )
    if depth:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def per_position_png(result: dict[str, Any], png: Path) -> Path:
    import matplotlib.pyplot as plt

    fig = per_position_figure(result)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def _md(title: str, sections: list[Section], out: Path, header: str = "") -> str:
    lines = [f"# {title}", ""] + ([header, ""] if header else [])
    for s in sections:
        lines += [f"## {s.title}", ""]
        for p in s.text:
            lines += [p, ""]
        for head, rows in s.tables:
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows] + [""]
        for cap, png in s.images:
            lines += [f"![{cap}]({png.relative_to(out)})", ""]
        for c in s.code:
            lines += ["```bash", c, "```", ""]
    return "\n".join(lines)


CSS = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "th{background:#f3f3f3}pre{background:#f6f8fa;padding:.8em;overflow-x:auto;white-space:pre-wrap}"
    "img{max-width:100%}.error{color:#b00020;font-weight:bold}.machine{color:#555}"
)


def _html(title: str, sections: list[Section], header: str = "") -> str:
    e = html.escape
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{e(title)}</h1>"
    ]
    if header:
        parts.append(f"<p class='machine'>{e(header)}</p>")
    for s in sections:
        parts.append(f"<h2>{e(s.title)}</h2>")
        parts += [f"<p>{e(p)}</p>" for p in s.text]
        for head, rows in s.tables:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            for row in rows:
                cls = " class='error'" if row and row[0] == "error" else ""
                parts.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
            parts.append("</table>")
        for cap, png in s.images:
            data = base64.b64encode(png.read_bytes()).decode()
            parts.append(
                f"<figure><img alt='{e(cap)}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{e(cap)}</figcaption></figure>"
            )
        parts += [f"<pre><code>{e(c)}</code></pre>" for c in s.code]
    parts.append("</body></html>")
    return "\n".join(parts)


def summary(ctx: Ctx, timings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    words, ids = wiring_words(ctx)
    res = ctx.results["bench"]["result"]
    return {
        "format": "eaglewire.run-summary/1",
        "target": ctx.target.identity.__dict__,
        "family": ctx.cfg.family.name,
        "taps": list(ctx.contract.taps),
        "wiring": words,
        "engine_ids": ids,
        "config": ctx.cfg.model_dump(mode="json"),
        "data": {k: ctx.results["regenerate"][k] for k in ("conversations", "from_shipped", "new_tokens_this_run")},
        "vocab": {k: ctx.results["vocab"][k] for k in ("coverage", "sha256", "samples", "tokens", "trained_tokens")},
        "heldout": ctx.results["train"]["heldout"],
        "draft": ctx.results["train"]["draft"],
        "exports": ctx.results["export"]["exports"],
        "doctor_errors": {f: r["errors"] for f, r in ctx.results["doctor"]["reports"].items()},
        "bench": {n: {k: m[k] for k in m if k not in ("tok_s",)} for n, m in res["methods"].items()},
        "tau_before_after": res.get("tau_before_after"),
        "verdict": verdict(res, ctx.cfg.family.name),
        "launch": launch_commands(ctx),
        "stages": timings,
        "command": ctx.command,
        "total_s": round(sum(t["seconds"] for t in timings.values()), 1),
    }


def write_report(ctx: Ctx, timings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = ctx.out
    pngs = {"training": out / "report-training.png", "bench": out / "report-bench.png"}
    copy_into(Path(ctx.results["train"]["png"]), pngs["training"])
    per_position_png(ctx.results["bench"]["result"], pngs["bench"])
    title = f"eaglewire run: {family(ctx).title} draft for {ctx.target.name}"
    sections = _sections(ctx, timings, pngs)
    data = {**summary(ctx, timings), "machine": machine()}
    header = machine_line(data["machine"])
    atomic_write_json(out / "summary.json", data)
    atomic_write_text(out / "report.md", _md(title, sections, out, header))
    atomic_write_text(out / "report.html", _html(title, sections, header))
    return data
