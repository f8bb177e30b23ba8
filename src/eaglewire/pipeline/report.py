"""The run report: OUT/summary.json (machine-readable), OUT/report.md and a self-contained
OUT/report.html (pictures inlined as PNG data URIs; no scripts, no external files).

Both documents are rendered (pipeline/render.py) from the same list of sections (title, paragraphs, tables,
images), so they can never disagree; the benchmark's words are pipeline/report_bench.py's.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from eaglewire import hw
from eaglewire.about import __version__
from eaglewire.contract import WiringContract, describe_boundary, to_engine
from eaglewire.errors import TranslationError
from eaglewire.export.engines import engine_for
from eaglewire.families import Family, get_family
from eaglewire.pipeline.render import Section, html_page, markdown
from eaglewire.pipeline.report_bench import bench_rows, tau_change, verdict
from eaglewire.pipeline.context import Ctx
from eaglewire.safeio import atomic_write_json, atomic_write_text

ENGINE_IDS = ("sglang", "vllm")


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
    from eaglewire.target.embedded import embedded_gguf_path, embedded_key

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


def _sections(ctx: Ctx, timings: dict[str, dict[str, Any]], pngs: dict[str, Path]) -> list[Section]:
    return [
        _wiring_section(ctx),
        _data_section(ctx),
        _training_section(ctx, pngs["training"]),
        _doctor_section(ctx),
        _bench_section(ctx, pngs["bench"]),
        _deploy_section(ctx),
        _stages_section(ctx, timings),
    ]


def _wiring_section(ctx: Ctx) -> Section:
    r, cfg = ctx.results, ctx.cfg
    words, ids = wiring_words(ctx)
    return Section(
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


def _data_section(ctx: Ctx) -> Section:
    r, v = ctx.results, ctx.results["vocab"]
    return Section(
        "Data",
        [
            f"{r['regenerate']['conversations']} conversations from {ctx.cfg.data.source} answered by the target "
            f"(its regeneration file holds {r['regenerate']['in_file']}, {r['regenerate']['from_shipped']} of them "
            f"from the shipped data; {r['regenerate']['new_tokens_this_run']} tokens generated in this run); "
            f"{v['samples']} samples, "
            f"{v['tokens']} tokens, {v['trained_tokens']} trained (assistant) tokens.",
            "Vocab coverage: "
            + ", ".join(f"{k} {c:.2%}" for k, c in v["coverage"].items())
            + f" of trained tokens ({v['distinct_trained_tokens']} distinct).",
        ],
    )


def _training_section(ctx: Ctx, png: Path) -> Section:
    r, cfg = ctx.results, ctx.cfg
    h = r["train"]["heldout"]
    objective = (
        f"block {cfg.family.block_size}, {cfg.family.anchors} anchors per sequence"
        if trained_contract(ctx).block
        else f"TTT {cfg.train.ttt_steps} steps"
    )
    return Section(
        "Training",
        [
            f"{family(ctx).title}: {cfg.train.max_steps} steps, batch {cfg.train.batch_size}, {objective}, lr {cfg.train.lr}, "
            f"features {cfg.train.features}; {r['train']['train_samples']} training / {r['train']['heldout_samples']} "
            f"held-out samples.",
            "Held-out top-1 accuracy per draft position: " + ", ".join(f"{a:.3f}" for a in h.get("acc", [])),
        ]
        + [p for p in [tau_change(r["bench"]["result"])] if p],
        images=[("loss and per-position accuracy", png)],
    )


def _doctor_section(ctx: Ctx) -> Section:
    doctor = ctx.results["doctor"]
    reps = doctor["reports"]
    rows = [[f["level"], fmt, f["check"], f["what"], f["fix"]] for fmt, rep in reps.items() for f in rep["findings"]]
    return Section(
        "Doctor",
        [
            f"{doctor['errors']} error(s): "
            + "; ".join(
                f"{fmt} export ({rep['directory']}) checked as {rep['engine']}: {rep['errors']} error(s), "
                f"{len(rep['findings'])} finding(s)"
                for fmt, rep in reps.items()
            )
            + "."
        ],
        tables=[(["level", "export", "check", "what", "fix"], rows)] if rows else [],
    )


def _bench_section(ctx: Ctx, png: Path) -> Section:
    res = ctx.results["bench"]["result"]
    return Section(
        "Benchmark",
        [
            f"{res['prompts']} prompts from {res['questions']} (first turns), {res['max_new_tokens']} new tokens, greedy, "
            "one process, methods interleaved, medians; every method's tokens are compared with vanilla's.",
            verdict(res, ctx.cfg.family.name),
        ],
        tables=[bench_rows(res)],
        images=[("per-position acceptance (draft position 1, 2, 3 as in the training plot)", png)],
    )


def _deploy_section(ctx: Ctx) -> Section:
    return Section(
        "Deploy",
        [
            "Launch commands with the exported drafts and the benchmark's knobs "
            "(check first: eaglewire doctor DIR --engine sglang|vllm). On a GPU a verify "
            "of many tokens costs about one decode step, so deeper knobs pay off there; "
            "eaglewire doctor expect --draft DIR predicts τ for any knobs."
        ],
        code=list(launch_commands(ctx).values()),
    )


def _stages_section(ctx: Ctx, timings: dict[str, dict[str, Any]]) -> Section:
    ran = sum(t["seconds"] for t in timings.values() if not t["reused"])
    kept = [n for n, t in timings.items() if t["reused"]]
    return Section(
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
    _copy_into(Path(ctx.results["train"]["png"]), pngs["training"])
    per_position_png(ctx.results["bench"]["result"], pngs["bench"])
    title = f"eaglewire run: {family(ctx).title} draft for {ctx.target.name}"
    sections = _sections(ctx, timings, pngs)
    data = {**summary(ctx, timings), "machine": machine()}
    header = machine_line(data["machine"])
    atomic_write_json(out / "summary.json", data)
    atomic_write_text(out / "report.md", markdown(title, sections, out, header))
    atomic_write_text(out / "report.html", html_page(title, sections, header))
    return data


def _copy_into(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
