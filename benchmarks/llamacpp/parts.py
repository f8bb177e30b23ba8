"""Where a speculative round's time goes when llama.cpp serves the embedded target at Q4_1 with our EAGLE-3 draft,
part by part: (a) the target's cost of one decode step of 1..4 rows (llama-batched-bench: every row with logits,
as a verify of k+1 rows needs them), (b) the draft's own cost per round per GGUF precision and head size
(llama-server's speculative statistics, `dur(g)`), and (c) the round as served: round = draft(k) + verify(k+1) +
overhead, the overhead the measured remainder, and the tau each arm needs to break even with Q4_1 alone.

    python -m benchmarks.llamacpp.parts serve --out DIR     # the served arms -> DIR/served.json
    LLAMACPP_TOOLS=llama-batched-bench bash scripts/llamacpp_build.sh   # builds it beside llama-server, once
    python -m benchmarks.llamacpp.parts steps --batched-bench ~/.cache/eaglewire/llamacpp/0.3.36/bin/llama-batched-bench --out DIR
    python -m benchmarks.llamacpp.parts model --out DIR     # both joined: DIR/parts.json

Arms are PRECISION:HEAD:K (the head cut to its HEAD most frequent rows, benchmarks/llamacpp/head.py). Each
repetition runs Q4_1 alone, every draft arm in turn, Q4_1 alone again (its ratios use the mean of the two); ratios
are only ever quoted within one repetition. The step costs are a separate run (the targets in turn, repeated). Same prompts as levers.py (MT-bench
first turns spread over the categories, greedy, 2 threads); `uptime`'s load averages recorded around each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.llamacpp.head import TRAIN_DATA, TRAIN_LIMIT, coverage, draft_token_counts, shrink_head

STATS = re.compile(
    r"statistics\s+draft-eagle3: #calls\(b,g,a\) = +(\d+) +(\d+) +(\d+).*?#gen tokens = +(\d+), "
    r"#acc tokens = +(\d+).*?dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms"
)
DEFAULT_ARMS = "f32:8000:1,f16:8000:1,q8_0:8000:1,q4_0:8000:1,q4_0:4000:1,q4_0:2000:1,q8_0:2000:1,q4_0:2000:2"


def load() -> list[float]:
    """`uptime`'s 1, 5 and 15 minute load averages."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_ms(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used: a speed measure a busy shared machine does not
    stretch the way it stretches wall time (with one thread, nothing spins waiting for another)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def spec_stats(log: str) -> dict[str, float] | None:
    """The last cumulative 'statistics draft-eagle3' line of a llama-server log (-lv 4): calls to begin / draft /
    accept, drafted and accepted tokens, and the ms spent in each call kind."""
    found = STATS.findall(log)
    if not found:
        return None
    b, g, a, gen, acc, tb, tg, ta = found[-1]
    return {
        "calls_begin": int(b),
        "calls_draft": int(g),
        "calls_accept": int(a),
        "gen_tokens": int(gen),
        "acc_tokens": int(acc),
        "ms_begin": float(tb),
        "ms_draft": float(tg),
        "ms_accept": float(ta),
    }


def served_arm(
    model: Path, draft: Path | None, k: int, prompts: list[list[int]], max_new: int, threads: int
) -> dict[str, Any]:
    """One llama-server run: a warm-up request, then the prompts; its decode time (prefill excluded) and, with a
    draft, the draft's statistics over the counted prompts only (the log's cumulative lines, differenced)."""
    from eaglewire.serve.llamacpp import LlamaServer

    load_before = load()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with LlamaServer(model, draft, n_max=k, threads=threads, extra_args=["-lv", "4"], log_path=log) as srv:
            srv.complete(prompts[0], 16)  # warm-up, not counted
            s0, c0 = spec_stats(log.read_text(errors="replace")), cpu_ms(srv.proc.pid)
            w0 = time.monotonic()
            out = [srv.complete(p, max_new) for p in prompts]
            c1, wall = cpu_ms(srv.proc.pid), (time.monotonic() - w0) * 1000
            time.sleep(0.2)  # the slot's release lines are written after the response
            s1 = spec_stats(log.read_text(errors="replace"))
    ms = sum(c.predicted_ms for c in out)
    tokens = sum(len(c.tokens) for c in out)
    row: dict[str, Any] = {
        "tok_s": round(tokens / (ms / 1000), 2),
        "tokens": tokens,
        "decode_ms": round(ms, 1),
        # the decode's CPU time: its wall time times the CPU share the server got meanwhile
        "cpu_share": round((c1 - c0) / wall, 3),
        "decode_cpu_ms": round(ms * (c1 - c0) / wall, 1),
        "tok_per_cpu_s": round(tokens / (ms * (c1 - c0) / wall / 1000), 2),
        "ids": [c.tokens for c in out],
        "load_before": load_before,
        "load_after": load(),
    }
    if draft is not None:
        if s0 is None or s1 is None:
            raise RuntimeError(f"no speculative statistics in the llama-server log (-lv 4): {log}")
        d = {key: round(s1[key] - s0[key], 3) for key in s1}
        rounds = d["calls_accept"]
        row.update(k=k, stats=d, rounds=rounds, tau=round(1 + d["acc_tokens"] / rounds, 3))
    return row


def _cpu_of(cmd: list[str]) -> float:
    """CPU ms (user + system) a command used, from the kernel's accounting of waited-for children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def step_costs(bench: Path, model: Path, threads: int, depth: int, steps: int) -> dict[str, float]:
    """CPU ms of one target decode step of 1..4 rows, each row with its logits, after a shared prompt of `depth`:
    llama-batched-bench run with `steps` and with 4 decode steps, the difference per step (load and prefill cancel)."""
    out = {}
    for rows in (1, 2, 3, 4):
        base = [
            str(bench),
            "-m",
            str(model),
            "-c",
            "2048",
            "-npp",
            str(depth),
            "-npl",
            str(rows),
            "-pps",
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "--output-format",
            "jsonl",
            "-ntg",
        ]
        long, short = _cpu_of(base + [str(steps + 4)]), _cpu_of(base + ["4"])
        out[str(rows)] = round((long - short) / steps, 3)
    return out


def round_model(arm: dict[str, Any], alone_ms: float, ratio: dict[str, float]) -> dict[str, float]:
    """In CPU ms: round = draft(k) + verify(k+1) + overhead (the remainder). The draft's part is its share of the
    decode's wall time (llama-server's dur(g) + dur(a)); verify(k+1) is alone's cost per token times the measured
    cost of k+1 rows over 1 row. Break-even tau = round / alone's cost per token; and the draft cost per round that
    would break even at the measured tau."""
    s, k = arm["stats"], arm["k"]
    rnd = arm["decode_cpu_ms"] / arm["rounds"]
    draft = rnd * (s["ms_draft"] + s["ms_accept"]) / arm["decode_ms"]
    ver = alone_ms * ratio[str(k + 1)]
    over = rnd - draft - ver
    return {
        "round_ms": round(rnd, 3),
        "draft_ms": round(draft, 3),
        "draft_step_ms": round(draft / k, 3),
        "verify_ms": round(ver, 3),
        "overhead_ms": round(over, 3),
        "alone_ms_per_token": round(alone_ms, 3),
        "break_even_tau": round(rnd / alone_ms, 3),
        "break_even_draft_ms": round(arm["tau"] * alone_ms - ver - over, 3),
    }


def run_rep(
    a: argparse.Namespace,
    arms: list[tuple[str, int, int]],
    ggufs: dict[tuple[str, int], Path],
    model: Path,
    prompts: list[list[int]],
) -> dict[str, Any]:
    """Q4_1 alone, each draft arm in turn, Q4_1 alone again; speedups against the mean of the two alone runs."""
    rep: dict[str, Any] = {"arms": {}}
    first = served_arm(model, None, 0, prompts, a.max_new_tokens, a.threads)
    print(f"  alone: {first['tok_s']} tok/s ({first['tok_per_cpu_s']} per CPU s)", flush=True)
    for prec, head, k in arms:
        row = served_arm(model, ggufs[prec, head], k, prompts, a.max_new_tokens, a.threads)
        row["lossless"] = row["ids"] == first["ids"]
        rep["arms"][f"draft-{prec}/head{head}/k{k}"] = row
        print(
            f"  {prec} head {head} k={k}: {row['tok_s']} tok/s ({row['tok_per_cpu_s']} per CPU s), tau "
            f"{row['tau']}, lossless {row['lossless']}",
            flush=True,
        )
    last = served_arm(model, None, 0, prompts, a.max_new_tokens, a.threads)
    print(f"  alone again: {last['tok_s']} tok/s ({last['tok_per_cpu_s']} per CPU s)", flush=True)
    rep["alone"] = {
        "first": first,
        "last": last,
        "tok_s": round((first["tok_s"] + last["tok_s"]) / 2, 2),
        "tok_per_cpu_s": round((first["tok_per_cpu_s"] + last["tok_per_cpu_s"]) / 2, 2),
    }
    for row in rep["arms"].values():
        row["speedup"] = round(row["tok_s"] / rep["alone"]["tok_s"], 3)
        row["speedup_cpu"] = round(row["tok_per_cpu_s"] / rep["alone"]["tok_per_cpu_s"], 3)
    return rep


def add_parts(served: dict[str, Any], steps: dict[str, Any]) -> None:
    """Each served arm's round model, from its own repetition's alone speed and the steps' mean verify costs."""
    ratio = steps["ratio_to_one_row"]["q4_1"]
    for rep in served["reps"]:
        a = rep["alone"]
        alone_ms = statistics.fmean(r["decode_cpu_ms"] / r["tokens"] for r in (a["first"], a["last"]))
        for row in rep["arms"].values():
            row["parts"] = round_model(row, alone_ms, ratio)


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm over the repetitions: mean and spread of the speedup, tau and the round's parts."""
    out: dict[str, Any] = {}
    for name in reps[0]["arms"]:
        rows = [r["arms"][name] for r in reps]
        s = {
            "speedup": [r["speedup"] for r in rows],
            "speedup_cpu": [r["speedup_cpu"] for r in rows],
            "tau": [r["tau"] for r in rows],
            "tok_s": [r["tok_s"] for r in rows],
        }
        for key in rows[0].get("parts", {}):
            s[key] = [r["parts"][key] for r in rows]
        out[name] = {key: {"mean": round(statistics.fmean(v), 3), "min": min(v), "max": max(v)} for key, v in s.items()}
    return out


def serve(a: argparse.Namespace) -> dict[str, Any]:
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.hw import describe_cpu
    from eaglewire.serve.bench import bench_prompts
    from eaglewire.serve.llamacpp import llama_server_path, target_gguf
    from eaglewire.target.loader import load_target

    arms = [(p, int(h), int(k)) for p, h, k in (x.split(":") for x in a.arms.split(","))]
    target = load_target()
    draft = load_checkpoint(resolve_draft(None), target=target)
    prompts = [p[0].tolist() for p in bench_prompts(target, "mtbench", a.limit)]
    model = target_gguf("q4_1")
    cache = a.out / "head_counts.json"  # counting tokenizes the training data: once per results folder
    if not cache.is_file():
        c, t = draft_token_counts(target, draft)
        cache.write_text(json.dumps({"data": TRAIN_DATA, "limit": TRAIN_LIMIT, "total": t, "counts": c.tolist()}))
    saved = json.loads(cache.read_text())
    counts, total = torch.tensor(saved["counts"], dtype=torch.int64), saved["total"]
    result: dict[str, Any] = {
        "cpu": describe_cpu(),
        "llama_server": str(llama_server_path()),
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "threads": a.threads,
        "target": "q4_1",
        "draft_contract": draft.contract.fingerprint(),
        "draft_head": draft.cfg.draft_vocab_size,
        "head_coverage": {h: round(coverage(counts, total, h), 4) for _, h, _ in arms},
        "reps": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        ggufs = {}
        for prec, head in sorted({(p, h) for p, h, _ in arms}):
            small, contract = shrink_head(draft, draft.contract, counts, head)
            ggufs[prec, head] = (
                export_draft(
                    small, contract, Path(tmp) / f"{prec}-{head}", "llamacpp", gguf_dtype=prec, vocab_from=model
                )
                / "draft.gguf"
            )
        result["draft_gguf_bytes"] = {f"{p}/head{h}": g.stat().st_size for (p, h), g in ggufs.items()}
        for i in range(a.reps):
            print(f"repetition {i + 1}/{a.reps}", flush=True)
            result["reps"].append(run_rep(a, arms, ggufs, model, prompts))
    for rep in result["reps"]:
        for row in [*rep["arms"].values(), rep["alone"]["first"], rep["alone"]["last"]]:
            row.pop("ids")
    return result


def steps(a: argparse.Namespace) -> dict[str, Any]:
    """The target's decode-step costs, the precisions in turn, `reps` times; the mean per row count."""
    from eaglewire.serve.llamacpp import target_gguf

    precs = a.step_targets.split(",")
    reps = []
    for i in range(a.reps):
        rep: dict[str, Any] = {"load_before": load()}
        for p in precs:
            rep[p] = step_costs(a.batched_bench, target_gguf(p), a.threads, a.depth, a.steps)
            print(f"repetition {i + 1}: {p} ms per step of 1..4 rows {rep[p]}", flush=True)
        rep["load_after"] = load()
        reps.append(rep)
    mean = {p: {n: round(statistics.fmean(r[p][n] for r in reps), 3) for n in reps[0][p]} for p in precs}
    return {
        "tool": str(a.batched_bench),
        "depth": a.depth,
        "steps": a.steps,
        "threads": a.threads,
        "reps": reps,
        "mean_ms": mean,
        "ratio_to_one_row": {p: {n: round(v / m["1"], 3) for n, v in m.items()} for p, m in mean.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "part",
        choices=("serve", "steps", "model"),
        help="serve: the served arms (served.json); steps: "
        "the target's step costs (steps.json); model: both joined into the round model (parts.json)",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arms", default=DEFAULT_ARMS, help="PRECISION:HEAD:K, comma-separated")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--limit", type=int, default=8, help="MT-bench questions, spread over the categories")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batched-bench", type=Path, help="llama-batched-bench of the same build (the step costs)")
    ap.add_argument("--step-targets", default="q4_1,f32")
    ap.add_argument("--depth", type=int, default=128, help="prompt the steps decode after (KV entries)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per row count")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.part == "serve":
        (a.out / "served.json").write_text(json.dumps(serve(a), indent=1))
    elif a.part == "steps":
        (a.out / "steps.json").write_text(json.dumps(steps(a), indent=1))
    else:
        served = json.loads((a.out / "served.json").read_text())
        add_parts(served, json.loads((a.out / "steps.json").read_text()))
        summ = summary(served["reps"])
        (a.out / "parts.json").write_text(json.dumps({"summary": summ, "reps": served["reps"]}, indent=1))
        for name, row in summ.items():
            print(name, {k: v["mean"] for k, v in row.items()})


if __name__ == "__main__":
    main()
