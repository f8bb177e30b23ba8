"""`eaglewire doctor live` (probe a running engine against our prediction) and `doctor watch` (the alarm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from eaglewire.cli.common import err_console, load_target, out_console, styled
from eaglewire.cli.options import CiJsonOpt, NumDraftTokensOpt, NumStepsOpt, TopkOpt
from eaglewire.errors import EaglewireError

ENGINE_HELP = (
    "vllm, sglang, llamacpp or eaglewire (default: detected from the server's /metrics; llama-server needs --metrics)."
)
URL_HELP = "The running server, http://127.0.0.1:PORT (with or without /v1)."
PROMPTS_HELP = (
    "A named prompt set (mtbench, ...) or a FastChat/conversation file; first user turns, spread over its categories."
)
LIVE_K_HELP = "vLLM k, llama.cpp --spec-draft-n-max (default: read from the server's per-position counters)."
PLAIN_URL_HELP = "A plain server of the same target: measures the round cost (= break-even tau) for `doctor watch`."
ROUND_COST_HELP = (
    "One speculative round's cost in plain "
    "target steps (measured: `doctor live --plain-url`): alarm below "
    "this break-even tau too."
)


def _chats(prompts: str, limit: int) -> list[list[dict[str, str]]]:
    """First user turns of `limit` questions of a named set or file, spread over its categories (as `bench`)."""
    from eaglewire.serve.bench import spread_over_categories

    return [[{"role": "user", "content": c.user_turns[0]}] for c in spread_over_categories(prompts, limit)]


def _shape(k: Optional[int], knobs: tuple[Optional[int], ...], window: Any) -> Any:
    """The engine's shape: SGLang's knobs, vLLM's k, else k read from the server (its per-position series)."""
    from eaglewire.decoding.tree import TreeShape

    if any(v is not None for v in knobs) or k is not None:
        return TreeShape.from_knobs(*knobs, k)
    if window.counters.k:
        return TreeShape.chain(window.counters.k)
    raise EaglewireError(
        "the engine's shape is unknown",
        expected="--num-speculative-tokens K (vLLM) or --num-steps/--topk/--num-draft-tokens (SGLang)",
        found=f"{window.counters.engine} exposes no per-position counters to read k from",
        fix="pass the knobs the server was started with",
    )


def _plain_timing(plain_url: str, chats: list[Any], max_tokens: int, window: Any) -> dict[str, Any]:
    """Decode time per round (speculative server) and per token (plain server), streamed, prefill excluded."""
    from eaglewire.doctor.live import chat, served_model
    from eaglewire.doctor.watch import break_even_tau

    model = served_model(plain_url)
    plain = [chat(plain_url, model, m, max_tokens) for m in chats]
    spec_s = sum(a.decode_s for a in window.answers)
    plain_s = sum(a.decode_s for a in plain)
    plain_tokens = sum(max((a.completion_tokens or 0) - 1, 0) for a in plain)
    rounds = window.counters.drafts or 0
    if not (spec_s and plain_s and plain_tokens and rounds):
        return {"round_cost": None, "why": "too few streamed tokens or rounds to time"}
    round_s, token_s = spec_s / rounds, plain_s / plain_tokens
    return {
        "s_per_round": round(round_s, 5),
        "plain_s_per_token": round(token_s, 5),
        "round_cost": round(break_even_tau(round_s, token_s), 3),
        "plain_url": plain_url,
    }


def live_cmd(
    url: str = typer.Option(..., "--url", help=URL_HELP),
    draft: Path = typer.Option(..., "--draft", help="The draft the server runs (native or any export)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="The target the server runs."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help=ENGINE_HELP),
    prompts: str = typer.Option("mtbench", "--prompts", help=PROMPTS_HELP),
    limit: int = typer.Option(4, "--limit", help="Number of prompts (sent one at a time)."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Greedy tokens per prompt."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help=LIVE_K_HELP),
    num_steps: NumStepsOpt = None,
    topk: TopkOpt = None,
    num_draft_tokens: NumDraftTokensOpt = None,
    plain_url: Optional[str] = typer.Option(None, "--plain-url", help=PLAIN_URL_HELP),
    as_json: CiJsonOpt = False,
) -> None:
    """Probe a RUNNING engine: its speculative counters before and after greedy requests (deltas), against our
    engine on the same prompts at the same shape. Verdict healthy / below expectation (where, and what to run
    next) / no speculative counters / not lossless: an answer that differs from the target's greedy answer
    beyond a near-tie of the target's logits (each difference's cause is named; the reference decodes in the
    dtype the server reports). Exit 1 unless healthy."""
    from eaglewire.doctor.live import compare, probe_engine, served_numerics
    from eaglewire.doctor.live_lossless import numerics_line, tie_tolerance

    chats = _chats(prompts, limit)
    with err_console.status(f"probing {url}: {len(chats)} prompts x {max_tokens} greedy tokens"):
        window = probe_engine(url, chats, max_tokens, engine)
    shape = _shape(num_speculative_tokens, (num_steps, topk, num_draft_tokens), window)
    numerics = served_numerics(url)
    dtype = _reference_dtype(numerics)
    ref, divs = _our_engine(target, draft, dtype, shape, chats, max_tokens, window)
    rep = compare(
        window,
        ref,
        shape.num_steps,
        str(draft),
        target,
        divs,
        tie_tolerance(dtype, numerics.get("dtype")),
        numerics_line(dtype, numerics),
    )
    rep.timing = {"probe_s": round(window.seconds, 2), "prompts": len(chats), "max_tokens": max_tokens}
    if plain_url:
        rep.timing.update(_plain_timing(plain_url, chats, max_tokens, window))
    _print_live(rep, as_json)
    raise typer.Exit(0 if rep.verdict == "healthy" else 1)


def _reference_dtype(numerics: dict[str, Any]) -> str:
    """The dtype our reference decodes in: the server's where it reports float32 or bfloat16, else float32."""
    dtype = numerics.get("dtype") if numerics.get("dtype") in ("float32", "bfloat16") else "float32"
    err_console.print(
        f"our reference decodes in {dtype}"
        + (" (the server's dtype)" if numerics.get("dtype") else " (the engine does not report its dtype)"),
        highlight=False,
    )
    return dtype


def _our_engine(
    target: Optional[str], draft: Path, dtype: str, shape: Any, chats: list[Any], max_tokens: int, window: Any
) -> tuple[Any, Any]:
    """Our engine's answers on the same prompts at the engine's shape, and the target's margins where the
    server's answers differ from them."""
    import torch

    from eaglewire.compose import load_draft
    from eaglewire.doctor.live import chat_prompts, reference
    from eaglewire.doctor.live_lossless import divergences

    tgt = load_target(target, dtype=getattr(torch, dtype))
    d = load_draft(draft, tgt)
    contract = d.contract
    with err_console.status(f"our engine on the same prompts at {shape.num_steps} draft positions"):
        ref = reference(tgt, d, contract, shape, chats, max_tokens)
    with err_console.status("reading the target's margins where an answer differs"):
        divs = divergences(
            tgt, chat_prompts(tgt.tokenizer, chats), ref.tokens, [a.text for a in window.answers], ref.answers
        )
    return ref, divs


def _print_live(rep: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
        return
    style = {
        "healthy": "bold green",
        "below_expectation": "bold red",
        "no_counters": "yellow",
        "not_lossless": "bold red",
    }[rep.verdict]
    m, p, ll = rep.measured, rep.predicted, rep.lossless
    out_console.print(
        styled((rep.verdict.upper().replace("_", " "), style), f" {rep.engine}: {rep.message}"), highlight=False
    )
    out_console.print(f"{'':22}{'engine (window)':>18}{'our engine':>14}")
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    # the two figures are of two kinds (eaglewire.tau.TAU_KINDS): the engine's counters, our decoder's prediction
    out_console.print(f"{'tau (live | expect)':22}{fmt(m['tau']):>18}{fmt(p['tau']):>14}", highlight=False)
    for i in range(max(len(m["per_position"]), len(p["per_position"]))):
        a = m["per_position"][i] if i < len(m["per_position"]) else None
        b = p["per_position"][i] if i < len(p["per_position"]) else None
        out_console.print(f"{f'accepted at position {i + 1}':22}{fmt(a):>18}{fmt(b):>14}", highlight=False)
    rounds = "-" if m["drafts"] is None else f"{m['drafts']:.0f}"
    out_console.print(
        f"rounds in the window: {rounds}; lossless: {ll['identical']}/{ll['prompts']} answers "
        f"equal the target's greedy answers"
        + ("" if ll["same_template"] else " (the engine's prompt lengths differ from ours: another chat template?)"),
        highlight=False,
    )
    if ll.get("cause") and ll["cause"] not in rep.message:  # every difference is named in the verdict line
        out_console.print(f"why they differ: {ll['cause']}", highlight=False)
    if rep.points_at:
        out_console.print(f"points at: {rep.points_at}\nnext: {rep.next_command}", highlight=False)
    if rep.timing.get("round_cost"):
        out_console.print(
            f"round cost {rep.timing['round_cost']:.2f} plain steps = break-even tau "
            f"(doctor watch --round-cost {rep.timing['round_cost']:.2f})",
            highlight=False,
        )


def watch_cmd(
    url: str = typer.Option(..., "--url", help=URL_HELP),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help=ENGINE_HELP),
    interval: float = typer.Option(60.0, "--interval", help="Seconds between readings."),
    iterations: int = typer.Option(60, "--iterations", help="Readings after the first (bounded)."),
    min_tau: float = typer.Option(1.0, "--min-tau", help="Alarm below this tau."),
    round_cost: Optional[float] = typer.Option(None, "--round-cost", help=ROUND_COST_HELP),
    min_drafts: int = typer.Option(20, "--min-drafts", help="Rounds a window needs to be judged."),
    once: bool = typer.Option(False, "--once", help="One-shot: stop at the first alarm, exit 1."),
    as_json: CiJsonOpt = False,
) -> None:
    """Watch a live server's speculative counters: every --interval s, tau over the window since the last
    reading (deltas); an alarm when it falls below --min-tau or the break-even tau (--round-cost). Exit 1 on
    an alarm."""
    from eaglewire.doctor.live import snapshot
    from eaglewire.doctor.watch import watch

    alarm = max(min_tau, round_cost or 0.0)
    first = snapshot(url, engine)
    say = (
        (lambda r: None)
        if as_json
        else (lambda r: out_console.print(f"{r.at_s:8.1f}s  {r.state.upper():11} {r.why}", highlight=False))
    )
    rep = watch(lambda: snapshot(url, first.engine), alarm, interval, iterations, min_drafts, once, say)
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        out_console.print(f"alarm tau {alarm:.2f}: " + ("ALARM" if rep.alarmed else "no alarm"), highlight=False)
    raise typer.Exit(1 if rep.alarmed else 0)
