"""The block drafter's silent failures, reproduced in the real engine: broken vLLM exports of a DFlash draft,
each served by vLLM's CPU build (`method: "dflash"`), beside what `eaglewire doctor DIR --engine vllm --json`
says before launch. The DFlash counterpart of benchmarks/doctor/vllm_broken_exports.py (issue 52 item 4).

    python -m benchmarks.doctor.vllm_broken_dflash --draft DFLASH_DIR --prompts 2 --max-new-tokens 32
    python -m benchmarks.doctor.vllm_broken_dflash --doctor-only --out RESULTS_DIR   # no vLLM: the doctor column again

Per case: the vLLM export of the draft, damaged one way (CASES: the failures the field reports); the doctor on
it (`eaglewire doctor DIR --engine vllm --json`, a subprocess, so it is the CLI users run; its exit code and
error findings); then vLLM serves it (greedy, fp32, eager, one request at a time, num_speculative_tokens = B-1):
refused (the server does not start; the log's last error) or run, with tau and per-position acceptance from
vLLM's own counters. vLLM's rows are cached in OUT/vllm_cache.json keyed by the damaged export's digest and the
serving settings, so a rerun serves only what changed and `--doctor-only` recomputes the doctor column alone
(after the doctor changed) in seconds. Needs scripts/vllm_venv.sh. Writes OUT/cases.json and OUT/table.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any, Callable

from benchmarks.results_dir import run_dir  # benchmarks/results/<topic>/<date>-<cpu>/

Edit = Callable[[dict], None]
AUX = "eagle_aux_hidden_state_layer_ids"


# Our vLLM export is speculators' layout (top-level aux_hidden_state_layer_ids in HF numbering, block_size,
# mask_token_id; the layer config under transformer_layer_config), which vLLM's updater turns into dflash_config
# and eagle_aux_hidden_state_layer_ids; z-lab's layout (--layout zlab) writes dflash_config itself. Each edit
# damages whichever layout it is given, the key the engine reads.
def _ids_key(cfg: dict) -> tuple[dict, str]:
    return (
        (cfg, "aux_hidden_state_layer_ids")
        if "aux_hidden_state_layer_ids" in cfg
        else (cfg.setdefault("dflash_config", {}), "target_layer_ids")
    )


def _block_key(cfg: dict, key: str) -> dict:
    return cfg if key in cfg else cfg.setdefault("dflash_config", {})


def _layer_cfg(cfg: dict) -> dict:
    return cfg.get("transformer_layer_config", cfg)


def _shift_ids(cfg: dict) -> None:
    """Every written layer id one lower: the off-by-one of a tool that numbers taps another way."""
    at, key = _ids_key(cfg)
    at[key] = [i - 1 for i in at[key]]


def _eagle_aux_leftover(cfg: dict) -> None:
    """An EAGLE-3 field left in the config (a converted or hand-edited draft): vLLM reads it first and it wins."""
    _layer_cfg(cfg)[AUX] = [2, 15, 27]  # EAGLE-3's default taps of a 30-layer target in vLLM's numbering
    cfg[AUX] = [2, 15, 27]


def _neox_off(cfg: dict) -> None:
    _layer_cfg(cfg)["is_neox_style"] = False  # vLLM 0.32 reads the draft's RoPE layout here (default True)


def _block_size(cfg: dict) -> None:
    """The config's block size doubled (the draft was trained with B), launched with the nst it implies."""
    at = _block_key(cfg, "block_size")
    at["block_size"] = 2 * at["block_size"]


def _mask_token(cfg: dict) -> None:
    at = _block_key(cfg, "mask_token_id")
    at["mask_token_id"] = 0 if at["mask_token_id"] != 0 else 1  # a real token's row, not the trained mask


def _ids_missing(cfg: dict) -> None:
    at, key = _ids_key(cfg)
    at.pop(key)


# name -> (what, config edit, whether the launch line's num_speculative_tokens follows the damaged block size)
CASES: dict[str, tuple[str, Edit | None, bool]] = {
    "clean": ("the export as written", None, False),
    "ids_shifted": ("layer ids shifted by one (-1)", _shift_ids, False),
    "eagle_aux_leftover": (
        "an eagle_aux_hidden_state_layer_ids leftover (EAGLE-3's [2, 15, 27])",
        _eagle_aux_leftover,
        False,
    ),
    "neox_off": ("is_neox_style: false (trained neox)", _neox_off, False),
    "block_size": ("block_size doubled, launched with the nst it implies", _block_size, True),
    "mask_token": ("mask_token_id of another token", _mask_token, False),
    "ids_missing": ("layer ids missing", _ids_missing, False),
}


def digest(directory: Path) -> str:
    """sha256 over the export's files (names and bytes): the cache key of a vLLM row."""
    h = hashlib.sha256()
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(directory).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def damaged(src: Path, out: Path, edit: Edit | None) -> Path:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    if edit is not None:
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def nst_of(directory: Path) -> int:
    """The drafts per round the export's own config implies (B - 1): what its launch line asks vLLM for."""
    cfg = json.loads((directory / "config.json").read_text())
    return int(_block_key(cfg, "block_size")["block_size"]) - 1


def doctor(directory: Path, src: Path | None) -> dict:
    """`eaglewire doctor DIR --engine vllm --json` as users run it (this checkout's eaglewire, or the one in `src`)."""
    cmd = [sys.executable, "-m", "eaglewire.cli", "doctor", str(directory), "--engine", "vllm", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"PYTHONPATH": str(src)} if src else {})}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    try:
        rep = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"exit": p.returncode, "errors": -1, "checks": [], "first": (p.stderr or p.stdout)[-300:]}
    errs = [f for f in rep.get("findings", []) if f.get("level") == "error"]
    return {
        "exit": p.returncode,
        "errors": len(errs),
        "checks": sorted({f.get("check", "?") for f in errs}),
        "first": errs[0].get("what", "") if errs else "",
    }


def serve(
    directory: Path, target_dir: Path, prompts: list[list[int]], max_new: int, nst: int, timeout: int, port: int | None
) -> dict:
    from eaglewire.errors import EaglewireError
    from eaglewire.vllm_client.server import VllmServer, complete_ids, spec_metrics

    spec = {"method": "dflash", "model": str(directory), "num_speculative_tokens": nst}
    t0 = time.perf_counter()
    srv = VllmServer(
        target_dir,
        dtype="float32",
        speculative_config=spec,
        max_num_seqs=1,
        startup_timeout=timeout,
        enforce_eager=True,
    )
    if port:  # a port of the caller's choosing (127.0.0.1 only) instead of a free one
        srv.port = port
    try:
        with srv:
            outs = [complete_ids(srv.base_url, srv.model_name, p, max_new) for p in prompts]
            m = spec_metrics(srv.base_url)
    except (EaglewireError, urllib.error.URLError, TimeoutError) as err:  # refused at start, or crashed serving
        state = "refused" if isinstance(err, EaglewireError) else "crashed on the first request"
        text = srv.log_path.read_text(errors="replace") if srv.log_path.is_file() else str(err)
        lines = [x.strip() for x in text.splitlines() if re.search(r"\w+(Error|Exception): ", x)]
        causes = [
            x.split("] ", 1)[-1] for x in lines if "Engine core initialization failed" not in x and "ulimit" not in x
        ]
        return {"vllm": state, "why": (causes[-1] if causes else str(err))[:300], "seconds": time.perf_counter() - t0}
    return {
        "vllm": "ran",
        "tau": m.get("tau"),
        "per_position": m.get("per_position"),
        "drafts": m.get("num_drafts"),
        "outputs": outs,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, help="a native DFlash checkpoint (default: the released DFlash draft)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--only", default="", help="comma list of cases (default: all)")
    ap.add_argument(
        "--layout",
        default="vllm",
        choices=("vllm", "zlab"),
        help="the export damaged: our vLLM "
        "(speculators) export, or z-lab's HF layout (dflash_config), which vLLM also loads",
    )
    ap.add_argument(
        "--doctor-only", action="store_true", help="no vLLM: the doctor column again, vLLM's rows from the cache"
    )
    ap.add_argument("--doctor-src", type=Path, help="run the doctor of another eaglewire source tree (its src/)")
    ap.add_argument(
        "--fit-steps",
        type=int,
        default=0,
        help="first fit the draft to the target's greedy "
        "continuations of the measured prompts (tests/dflash_ref.py fit, as the CI test does): a wiring "
        "experiment with a draft that accepts well on these prompts, not a quality figure",
    )
    ap.add_argument("--work", type=Path, help="where the damaged exports are written (default: the user cache)")
    ap.add_argument("--port", type=int, default=0, help="vLLM's port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--startup-timeout", type=int, default=900)
    ap.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/doctor/DATE-CPU-fp32-dflash-LAYOUT"
    )
    args = ap.parse_args()
    args.out = args.out or run_dir("doctor", "fp32", f"dflash-{args.layout}")
    from eaglewire.cache import cache_root
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.export.convert import export_draft
    from eaglewire.hw import describe_cpu
    from eaglewire.serve.bench import bench_prompts
    from eaglewire.target.loader import load_target, resolve_target

    work = args.work or cache_root() / "vllm_broken_dflash" / args.layout  # damaged copies: never in the repository
    if (
        args.doctor_only
        and (args.out / "cases.json").is_file()
        and all((work / n / "config.json").is_file() for n in CASES)
    ):
        return doctor_again(args, work)  # the exports the cached vLLM rows were measured on, as they are
    target, target_dir = load_target(), resolve_target(None)[1]
    draft_dir = args.draft or Path(__file__).parents[1] / "src/eaglewire/assets/drafts/smollm2-135m-dflash"
    draft = load_checkpoint(draft_dir, target=target)
    prompt_ids = bench_prompts(target, "mtbench", args.prompts)
    if args.fit_steps:
        fit_to_prompts(target, draft, prompt_ids, args.max_new_tokens, args.fit_steps)
    base = export_draft(draft, draft.contract, work / "base", args.layout, force=True)
    prompts = [p[0].tolist() for p in prompt_ids]
    args.out.mkdir(parents=True, exist_ok=True)
    cache_path = args.out / "vllm_cache.json"
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    rows: dict[str, Any] = {
        "_meta": {
            "cpu": describe_cpu()["model"],
            "draft": str(draft_dir),
            "contract": draft.contract.fingerprint(),
            "prompts": args.prompts,
            "layout": args.layout,
            "fit_steps": args.fit_steps,
            "argv": " ".join(sys.argv[1:]),
            "max_new_tokens": args.max_new_tokens,
            "block": draft.contract.block.to_dict(),
        }
    }
    trained_nst = draft.contract.block.drafts_per_round
    for name in args.only.split(",") if args.only else list(CASES):
        what, edit, follows = CASES[name]
        d = damaged(base, work / name, edit)
        nst = nst_of(d) if follows else trained_nst
        key = hashlib.sha256(json.dumps([digest(d), prompts, args.max_new_tokens, nst]).encode()).hexdigest()
        row: dict[str, Any] = {
            "case": what,
            "num_speculative_tokens": nst,
            "digest": key[:16],
            "doctor": doctor(d, args.doctor_src),
        }
        if key not in cache and not args.doctor_only:
            cache[key] = serve(d, target_dir, prompts, args.max_new_tokens, nst, args.startup_timeout, args.port)
            cache_path.write_text(json.dumps(cache, indent=2))
        row.update(cache.get(key, {"vllm": "not measured"}))
        rows[name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "outputs"})[:400], flush=True)
    (args.out / "cases.json").write_text(json.dumps(rows, indent=2))
    (args.out / "table.md").write_text(table(rows, " ".join(sys.argv[1:])))
    print(table(rows, " ".join(sys.argv[1:])))


def doctor_again(args: argparse.Namespace, work: Path) -> None:
    """The doctor column alone, on the damaged exports kept from the last full run (cases.json names them)."""
    rows = json.loads((args.out / "cases.json").read_text())
    cache = json.loads((args.out / "vllm_cache.json").read_text())
    for name in [n for n in rows if n != "_meta"]:
        rows[name]["doctor"] = doctor(work / name, args.doctor_src)
        print(name, json.dumps(rows[name]["doctor"])[:300], flush=True)
    if stale := [n for n, r in rows.items() if n != "_meta" and r["digest"] not in {k[:16] for k in cache}]:
        raise SystemExit(f"cases {stale} have no vLLM row in {args.out / 'vllm_cache.json'}: run without --doctor-only")
    (args.out / "cases.json").write_text(json.dumps(rows, indent=2))
    (args.out / "table.md").write_text(table(rows, rows["_meta"].get("argv", "")))
    print(table(rows, rows["_meta"].get("argv", "")))


def fit_to_prompts(target: Any, draft: Any, prompts: list[Any], max_new: int, steps: int) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))  # the CI test's reference fit, reused as is
    from dflash_ref import fit, greedy_continuation

    B = draft.block.block_size
    seqs = [torch.cat([p[0], torch.tensor(greedy_continuation(target, p, max_new + B))])[None] for p in prompts]
    torch.manual_seed(0)
    losses = fit(target, draft, seqs, [p.shape[1] - 1 for p in prompts], steps=steps)
    print(f"fitted {steps} steps to the prompts' continuations: loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)


def table(rows: dict, argv: str) -> str:
    meta, clean = rows["_meta"], rows.get("clean", {}).get("outputs")
    b = meta["block"]
    lines = [
        f"Broken {meta['layout']}-layout exports of a DFlash draft (block {b['block_size']}, mask token {b['mask_token_id']}; "
        f"contract {meta['contract']}) in vLLM's CPU build (method dflash, fp32, greedy, eager; "
        f"{meta['prompts']} MT-bench prompts x {meta['max_new_tokens']} tokens; CPU {meta['cpu']})"
        + (
            f". The draft was fitted {meta['fit_steps']} steps to the target's continuations of these prompts: "
            "a wiring experiment, its clean τ is high by construction, not a quality figure"
            if meta["fit_steps"]
            else ""
        ),
        "",
        f"    python -m benchmarks.doctor.vllm_broken_dflash {argv}",
        "",
        "| case | nst | vLLM | τ | per-position | = clean output | doctor before launch |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        if name == "_meta":
            continue
        d = r["doctor"]
        doc = (
            "caught: " + ", ".join(d["checks"])
            if d["errors"] > 0
            else ("no error" if name == "clean" else "not caught")
            if d["errors"] == 0
            else "doctor failed: " + d["first"][:80]
        ) + f" (exit {d['exit']})"
        if r["vllm"] == "ran":
            same = "–" if clean is None or name == "clean" else ("yes" if r["outputs"] == clean else "no")
            pp = ", ".join(f"{p:.2f}" for p in r["per_position"] or [])
            lines.append(
                f"| {r['case']} | {r['num_speculative_tokens']} | ran | {r['tau']:.2f} | {pp} | {same} | {doc} |"
            )
        else:
            lines.append(
                f"| {r['case']} | {r['num_speculative_tokens']} | {r['vllm']}: {r.get('why', '')[:100]} | – | "
                f"– | – | {doc} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
