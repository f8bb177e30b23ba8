"""The silent failures, reproduced in the real engine: broken vLLM exports of the released draft, each
served by vLLM's CPU build, beside what `eaglewire doctor` says before launch and `doctor expect` after.

    python -m benchmarks.doctor.vllm_broken_exports --prompts 4 --max-new-tokens 64 --k 3

Per case: the vLLM export of the released draft, damaged one way (CASES); the doctor on it twice — as
exported (with eaglewire_contract.json) and as a draft from another tool would arrive (no contract file,
--target given, so the wiring is measured); then vLLM serves it (EAGLE-3 chain k, fp32, one request at a
time): refused (the server does not start; the log's last error) or run, with tau and per-position
acceptance from vLLM's own counters; then `doctor expect` judges those counts against our engine's
prediction for the healthy draft on the same prompts. Resumable: each finished case is kept in
OUT/cases.json (delete an entry to measure it again). Needs scripts/vllm_venv.sh. Servers run eager (no
compile: ~40 s a start on 2 cores), so all cases take ~15 min.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file
from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

Tensors = dict[str, torch.Tensor]
IDS = "eagle_aux_hidden_state_layer_ids"


def _ids(ids: list[int]) -> Callable[[dict, Tensors], None]:
    def edit(cfg: dict, _t: Tensors) -> None:
        cfg[IDS] = ids

    return edit


def _unread_key(cfg: dict, _t: Tensors) -> None:
    cfg["aux_hidden_state_layer_ids"] = cfg.pop(IDS)  # a key vLLM does not read: it takes its default taps


def _d2t_absolute(_c: dict, t: Tensors) -> None:
    t["d2t"] = t["d2t"] + torch.arange(len(t["d2t"]))  # target ids where vLLM adds offsets


def _drop(key: str) -> Callable[[dict, Tensors], None]:
    def edit(_c: dict, t: Tensors) -> None:
        t.pop(key)

    return edit


def _no_vocab_size(cfg: dict, _t: Tensors) -> None:
    cfg.pop("draft_vocab_size")


def _sglang_names(_c: dict, t: Tensors) -> None:
    for k in [k for k in t if k.startswith("layers.0.")]:
        t["midlayer." + k[len("layers.0.") :]] = t.pop(k)


def _fc_single(_c: dict, t: Tensors) -> None:
    t["fc.weight"] = t["fc.weight"][:, : t["fc.weight"].shape[0]].contiguous()  # [H, H]: one state's width


def _norm_flag(cfg: dict, _t: Tensors) -> None:
    cfg["norm_before_residual"] = True  # a norm the draft was not trained with (vLLM applies it)


CASES: dict[str, tuple[str, Callable[[dict, Tensors], None] | None]] = {
    "healthy": ("the export as written", None),
    "sglang_ids": ("ids in SGLang's numbering [1, 14, 26]", _ids([1, 14, 26])),
    "embedding_tap": ("the embedding shifted in: [0, 2, 15]", _ids([0, 2, 15])),
    "unread_key": ("ids moved to a key vLLM does not read", _unread_key),
    "d2t_absolute": ("d2t as absolute target ids", _d2t_absolute),
    "d2t_missing": ("d2t missing", _drop("d2t")),
    "vocab_size_missing": ("draft_vocab_size missing from config.json", _no_vocab_size),
    "sglang_names": ("weights renamed for SGLang (midlayer.*)", _sglang_names),
    "fc_missing": ("fc missing", _drop("fc.weight")),
    "fc_single": ("fc one state wide [H, H]", _fc_single),
    "norm_flag": ("norm_before_residual: true (not trained with it)", _norm_flag),
}


def damaged(src: Path, out: Path, edit: Callable[[dict, Tensors], None] | None) -> Path:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    if edit is not None:
        cfg, t = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
        edit(cfg, t)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file(t, str(out / "model.safetensors"))
    return out


def doctor(directory: Path, target: Any, with_contract: bool, bounds: Any) -> dict:
    from eaglewire.doctor.checks import by_level, run_checks
    from eaglewire.doctor.measured_wiring import run_measurement
    from eaglewire.doctor.inspect import inspect_dir

    d = directory if with_contract else directory.with_name(directory.name + "-foreign")
    if not with_contract:
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(directory, d)
        (d / "eaglewire_contract.json").unlink()
    try:
        ins = inspect_dir(d, "vllm")
        rep = run_checks(ins, target)
        if not with_contract:
            rep.findings = by_level(rep.findings + run_measurement(ins, target, bounds)[1])
    except Exception as err:  # the doctor itself must not fall over on a damaged export: record it
        return {"errors": -1, "first": f"doctor raised {type(err).__name__}: {err}"}
    errs = [f for f in rep.findings if f.level == "error"]
    return {"errors": len(errs), "checks": sorted({f.check for f in errs}), "first": errs[0].what if errs else ""}


def serve(directory: Path, target_dir: Path, prompts: list[list[int]], max_new: int, k: int) -> dict:
    from eaglewire.vllm_client.server import VllmServer, complete_ids, spec_metrics
    from eaglewire.errors import EaglewireError

    spec = {"method": "eagle3", "model": str(directory), "num_speculative_tokens": k}
    t0 = time.perf_counter()
    # enforce_eager: no compile (a start ~40 s instead of ~1-2 min); tau does not depend on it
    srv = VllmServer(
        target_dir, dtype="float32", speculative_config=spec, max_num_seqs=1, startup_timeout=900, enforce_eager=True
    )
    try:
        with srv:
            outs = [complete_ids(srv.base_url, srv.model_name, p, max_new) for p in prompts]
            m = spec_metrics(srv.base_url)
    except (EaglewireError, urllib.error.URLError) as err:  # refused at start, or crashed serving (HTTP 500)
        state = "refused" if isinstance(err, EaglewireError) else "crashed on the first request"
        # the root cause from the whole log, not the "initialization failed" wrapper that follows it
        text = srv.log_path.read_text(errors="replace") if srv.log_path.is_file() else str(err)
        lines = [l.strip() for l in text.splitlines() if re.search(r"\w+(Error|Exception): ", l)]
        causes = [
            l.split("] ", 1)[-1] for l in lines if "Engine core initialization failed" not in l and "ulimit" not in l
        ]
        return {"vllm": state, "why": (causes[-1] if causes else str(err))[:300], "seconds": time.perf_counter() - t0}
    return {
        "vllm": "ran",
        "tau": m.get("tau"),
        "per_position": m.get("per_position"),
        "drafts": m.get("num_drafts"),
        "accepted": m.get("num_accepted_tokens"),
        "outputs": outs,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--only", default="", help="comma list of cases (default: all)")
    ap.add_argument("--out", type=Path, default=run_dir("doctor"))
    args = ap.parse_args()
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.serve.bench import bench_prompts
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.doctor.expect import Counts, judge, predict
    from eaglewire.capture.boundaries import sample_target
    from eaglewire.export.convert import export_draft
    from eaglewire.hw import describe_cpu
    from eaglewire.target.loader import load_target, resolve_target

    target, target_dir = load_target(), resolve_target(None)[1]
    draft = load_checkpoint(resolve_draft(None), target=target)
    from eaglewire.cache import cache_root

    work = cache_root() / "vllm_broken"  # damaged copies of a 20 MB export each: never in the repository
    base = export_draft(draft, draft.contract, work / "base", "vllm", verifier=str(target_dir))
    prompts = bench_prompts(target, "mtbench", args.prompts)
    tau, per_pos = predict(target, draft, draft.contract, TreeShape.chain(args.k), prompts, args.max_new_tokens)
    bounds = sample_target(target)
    path = args.out / "cases.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    done["_meta"] = {
        "cpu": describe_cpu(),
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "predicted_tau": tau,
        "predicted_per_position": per_pos,
    }
    names = args.only.split(",") if args.only else list(CASES)
    for name in names:
        if name in done:
            continue
        what, edit = CASES[name]
        d = damaged(base, work / name, edit)
        row: dict[str, Any] = {
            "case": what,
            "doctor_with_contract": doctor(d, target, True, bounds),
            "doctor_foreign": doctor(d, target, False, bounds),
        }
        row.update(serve(d, target_dir, [p[0].tolist() for p in prompts], args.max_new_tokens, args.k))
        if row["vllm"] == "ran" and row.get("drafts"):
            acc = [p * row["drafts"] for p in row["per_position"]]
            res = judge(tau, per_pos, None, Counts(row["drafts"], acc))
            row["expect"] = {"flagged": res.flagged, "message": res.message}
        done[name] = row
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(done, indent=2))
        print(name, json.dumps({k: v for k, v in row.items() if k != "outputs"})[:400], flush=True)
    (args.out / "table.md").write_text(table(done))
    print(table(done))


def table(done: dict) -> str:
    meta = done["_meta"]
    healthy = done.get("healthy", {}).get("outputs")
    lines = [
        f"Broken vLLM exports of the released draft in vLLM's CPU build (EAGLE-3 chain k={meta['k']}, fp32, "
        f"{meta['prompts']} MT-bench prompts x {meta['max_new_tokens']} tokens; our engine predicts tau "
        f"{meta['predicted_tau']:.2f}, first position {meta['predicted_per_position'][0]:.2f}; CPU "
        f"{meta['cpu']['model']})",
        "",
        "| case | vLLM | τ | per-position | = healthy output | doctor (as exported) | doctor (no contract, "
        "measured) | doctor expect |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in done.items():
        if name == "_meta":
            continue
        dc, df = r["doctor_with_contract"], r["doctor_foreign"]
        doc = lambda d: f"{d['errors']} error(s)" + (f": {', '.join(d.get('checks', []))}" if d["errors"] > 0 else "")  # noqa: E731
        if r["vllm"] == "ran":
            same = "yes" if healthy is not None and r["outputs"] == healthy else "no"
            ex = r.get("expect", {})
            lines.append(
                f"| {r['case']} | ran | {r['tau']:.2f} | {', '.join(f'{p:.2f}' for p in r['per_position'])} | "
                f"{same} | {doc(dc)} | {doc(df)} | {'flagged' if ex.get('flagged') else 'passed'} |"
            )
        else:
            lines.append(f"| {r['case']} | {r['vllm']}: {r['why'][:110]} | – | – | – | {doc(dc)} | {doc(df)} | – |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
