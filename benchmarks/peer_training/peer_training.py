"""eaglewire's trainer against a peer trainer (the `speculators` package's own training code), side by side on
one machine: equal data, equal order, equal trained tokens, equal TTT depth, at several budgets.

    python -m benchmarks.peer_training.peer_training --out benchmarks/results/peer_training/DATE-CPU

Both arms train from the same captured features (one capture of the embedded target at taps [2, 15, 27], bf16
storage) with the same draft vocabulary (d2t/t2d built from the training split), the same max sequence length
and the same batches in the same order: step i of either arm takes eaglewire's own i-th batch of `--batch-size`
samples (speculators packs them into one row of exactly their length). Budget b trains `--base-steps` x b steps
on fresh samples (one pass: data and compute grow together). Each arm runs in its own process with one thread
(torch.set_num_threads(1)); arms alternate within a budget so machine load hits both alike. Per arm: trained
tokens/s (training steps only) and the process' peak RSS.
- eaglewire: `eaglewire train --features ...` with its defaults except --ttt-steps (the peer's default depth);
- speculators: benchmarks/peer_training/peer_speculators_arm.py in the speculators venv (what of its trainer runs, and why,
  is that file's docstring).
Each draft is then scored the same way here (peer_scoring.py): tau of a greedy chain k=3 on MT-bench first turns
spread over the categories, offline for every draft (the answers eaglewire's engine decodes, walked round by
round) and online with eaglewire's decoder at `--online` budgets (with acceptance per position), and
teacher-forced top-1 per TTT position on held-out regenerated conversations (never trained on; MT-bench is
never training data).

Arms (ARMS): `speculators`, and eaglewire with each of its norm sets (`eaglewire train --norms`, named
explicitly so an arm means the same when a default changes): `eaglewire` (eagle3: none), `eaglewire_eagle31`
(eagle3.1: a norm per captured state and the post-norm state fed back) and `eaglewire_norms` (speculators'
own eagle3 norm defaults, so that arm says how much of a gap between the trainers the norms explain);
`eaglewire_flat` and `eaglewire_eagle31_flat` weigh every TTT position alike, as speculators' loss does
(eaglewire's default decays 0.8**position); `eaglewire_eagle31_muon` trains with Muon, speculators' default
optimizer; `eaglewire_eagle31_fp32` trains in fp32 as speculators does on a CPU (eaglewire autocasts to bf16
where the CPU has it natively); `eaglewire_eagle31_warm2` warms up 2 steps (about speculators' 1%) instead of 20;
`eaglewire_eagle31_frozen_head` keeps the head at the target's rows, as speculators does.

DFlash (`--family dflash`): the same frame for block drafters. One capture at z-lab's five default taps
(`eaglewire data capture --family dflash`'s), the full vocabulary (no d2t), the same block size and mask token
(eaglewire's contract: `pick_mask_token`, 16 for SmolLM2), one draft layer, the same batches in the same
order; arms `eaglewire` (`eaglewire train --family dflash` with its defaults) and `speculators` (its
DFlashDraftModel and trainer: what runs, and why, is peer_speculators_arm.py's docstring). Its checkpoint is
read back through eaglewire's import of the vLLM/speculators DFlash layout (export/block.py). Both drafts are
scored online only (eaglewire's lossless decoder, a whole block per round: tau and acceptance per slot).

Resumable: every arm keeps its run in ~/.cache/eaglewire/peer_training/ and its scored row in rows/; a rerun
skips what is finished. `--extra ARM@BUDGET` adds one arm at one budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from eaglewire.cache import cache_root
from eaglewire.capture.features import capture_features
from eaglewire.export.engines import engine_for
from eaglewire.data.samples import DEFAULT_HELDOUT_FRACTION, Sample, load_samples, split_heldout
from eaglewire.train.dist import DistInfo
from eaglewire.train.loop import TrainConfig, global_batches
from eaglewire import load_target
from eaglewire.draft.vocab import DEFAULT_DRAFT_VOCAB

SOURCES = "smollm2-regen+smollm2-regen-vllm"  # regenerated ShareGPT conversations (no evaluation prompts)
TAPS = (2, 15, 27)
SPEC_PY = Path(
    os.environ.get("EAGLEWIRE_SPECULATORS_PYTHON", cache_root() / "client-venvs" / "speculators" / "bin" / "python")
)
HERE = Path(__file__).resolve().parent
# eaglewire arms: the options each adds to `eaglewire train` (every other setting is the trainer's default)
ARMS: dict[str, list[str]] = {
    "eaglewire": ["--norms", "eagle3"],
    "eaglewire_eagle31": ["--norms", "eagle3.1"],
    "eaglewire_norms": ["--norms", "speculators"],
    "eaglewire_flat": ["--norms", "eagle3", "--ttt-decay", "1.0"],
    "eaglewire_eagle31_flat": ["--norms", "eagle3.1", "--ttt-decay", "1.0"],
    "eaglewire_eagle31_muon": ["--norms", "eagle3.1", "--optimizer", "muon"],
    "eaglewire_eagle31_fp32": ["--norms", "eagle3.1", "--dtype", "fp32"],
    "eaglewire_eagle31_warm2": ["--norms", "eagle3.1", "--warmup-steps", "2"],
    "eaglewire_eagle31_frozen_head": ["--norms", "eagle3.1", "--train-only", "body"],
}
ARM_NORMS = {"speculators": "speculators", **{arm: opts[1] for arm, opts in ARMS.items()}}
DFLASH_LAYERS = 1  # both DFlash arms: eaglewire's default draft depth (speculators' is 5; equal compute)


def is_dflash(a: argparse.Namespace) -> bool:
    return a.family == "dflash"


def arm_norms(arm: str, a: argparse.Namespace) -> str:
    return "-" if is_dflash(a) else ARM_NORMS[arm]


def run_key(arm: str, budget: int, a: argparse.Namespace) -> str:
    """The name of one arm's run at one budget: a changed setting trains anew."""
    if is_dflash(a):
        return f"dflash-{arm}-x{budget}-s{a.base_steps * budget}-b{a.batch_size}-B{a.block_size}-A{a.anchors}-L{a.max_length}"
    return f"{arm}-x{budget}-s{a.base_steps * budget}-b{a.batch_size}-t{a.ttt}-L{a.max_length}"


def target_settings(a: argparse.Namespace, target) -> None:
    """The verifier directory speculators reads, and the taps in both numberings, onto `a`."""
    a.verifier = a.work / "verifier"
    if not (a.verifier / "config.json").exists():
        target.model.save_pretrained(a.verifier)  # speculators reads the verifier's config, weights and
        target.tokenizer.save_pretrained(a.verifier)  # tokenizer here
    if is_dflash(a):  # z-lab's five default taps, the mask token eaglewire picks: the one contract both arms use
        from eaglewire.draft.dflash_contract import default_dflash_contract
        from eaglewire.export.block import block_format

        a.contract = default_dflash_contract(target, a.block_size)
        a.taps, a.mask_token_id = list(a.contract.taps), a.contract.block.mask_token_id
        a.spec_layer_ids = list(a.contract.engine_ids(block_format("dflash", "vllm").convention))
        return
    a.taps, a.spec_layer_ids = list(TAPS), list(target.contract(TAPS).engine_ids(engine_for("vllm").convention))


def prepare(a: argparse.Namespace, target) -> tuple[Path, Path, list[Sample], list[Sample]]:
    """(features dir, vocab file, training samples in capture order, held-out samples). The vocab counts the
    training split only; features hold the training samples the largest budget needs, then the held-out ones."""
    from eaglewire.workflows import build_vocab

    work = a.work
    samples = load_samples(SOURCES, target.tokenizer, max_length=a.max_length)[0]
    train, held = split_heldout(samples, DEFAULT_HELDOUT_FRACTION)
    need = a.base_steps * max(a.budgets) * a.batch_size
    if need > len(train):
        raise SystemExit(
            f"the largest budget needs {need} training samples; {SOURCES} has {len(train)} at "
            f"--max-length {a.max_length}: lower --base-steps or the budgets"
        )
    vocab = work / "vocab.safetensors"
    if is_dflash(a):
        vocab = None  # full vocabulary
    elif not vocab.exists():
        build_vocab(target, samples, DEFAULT_DRAFT_VOCAB, DEFAULT_HELDOUT_FRACTION, vocab, data=SOURCES)
    train, held = train[:need], held[: a.heldout]
    # a capture for more training samples holds these as its prefix (same order, same held-out): reuse it
    tag = "dflash-" if is_dflash(a) else ""
    pattern = f"{tag}features-L{a.max_length}-n*-h{a.heldout}"
    bigger = sorted(
        (int(d.name.split("-n")[1].split("-")[0]), d) for d in work.glob(pattern) if (d / "manifest.json").exists()
    )
    feats = next((d for n, d in bigger if n >= need), work / f"{tag}features-L{a.max_length}-n{need}-h{a.heldout}")
    if not (feats / "manifest.json").exists() and is_dflash(a):
        capture_features(target, a.contract, train + held, feats, pad_id=target.pad_id)
    elif not (feats / "manifest.json").exists():
        from eaglewire.draft.vocab import load_vocab

        contract = target.contract(TAPS, vocab_map=load_vocab(vocab)[0])
        capture_features(target, contract, train + held, feats, pad_id=target.pad_id)
    return feats, vocab, train, held


def wait_peak(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, float]:
    """Run cmd (output to log); (wall s, the child's own peak RSS in MB, from wait4)."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[:3]} failed (exit {os.waitstatus_to_exitcode(status)}); see {log}")
    return time.perf_counter() - t0, ru.ru_maxrss / 1024


def family_options(arm: str, vocab: Path | None, a: argparse.Namespace) -> list[str]:
    """`eaglewire train` options of the family and arm: DFlash's block, anchors and depth (the speculators
    job's: `speculators_job`), or EAGLE-3's vocab, TTT depth and the arm's options."""
    if is_dflash(a):
        return [
            "--family",
            "dflash",
            "--block-size",
            str(a.block_size),
            "--anchors",
            str(a.anchors),
            "--num-layers",
            str(DFLASH_LAYERS),
        ]
    return ["--vocab", str(vocab), "--ttt-steps", str(a.ttt), *ARMS[arm]]


def speculators_job(
    run: Path, feats: Path, vocab: Path | None, batches: list[list[str]], a: argparse.Namespace
) -> dict:
    """What peer_speculators_arm.py reads: the features, the batches in order, and the draft's settings."""
    job = {
        "features": str(feats),
        "batches": batches,
        "vocab": str(vocab) if vocab else None,
        "out": str(run),
        "threads": 1,
        "verifier": str(a.verifier),
        "target_layer_ids": list(a.spec_layer_ids),
        "ttt_steps": a.ttt,
    }
    if is_dflash(a):  # eaglewire's draft and objective size (peer_speculators_arm.py's docstring)
        job.update(
            family="dflash",
            block_size=a.block_size,
            mask_token_id=a.mask_token_id,
            num_layers=DFLASH_LAYERS,
            max_anchors=a.anchors * a.batch_size,
        )
    return job


def train_eaglewire(run: Path, feats: Path, vocab: Path, steps: int, a: argparse.Namespace, arm: str) -> dict:
    """`eaglewire train` on the first steps x batch training samples of the features, one thread."""
    args = [
        "train",
        "--features",
        str(feats),
        "--out",
        str(run),
        "--max-steps",
        str(steps),
        "--batch-size",
        str(a.batch_size),
        "--train-limit",
        str(steps * a.batch_size),
        "--eval-every",
        str(steps),
        "--ckpt-every",
        str(steps),
        *family_options(arm, vocab, a),
    ]
    code = (
        "import sys, torch; torch.set_num_threads(1); sys.argv = ['eaglewire'] + sys.argv[1:]; "
        "from eaglewire.cli.app import main; main()"
    )
    wall, peak = wait_peak([sys.executable, "-c", code, *args], run.with_suffix(".log"))
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l]
    last = [r for r in rows if r["split"] == "train"][-1]
    return {"wall_s": wall, "peak_rss_mb": peak, "tok_per_s": last["tok_per_s"]}


def train_speculators(run: Path, feats: Path, vocab: Path, batches: list[list[str]], a: argparse.Namespace) -> dict:
    if not SPEC_PY.exists():
        raise SystemExit(
            f"no speculators venv at {SPEC_PY}: bash scripts/speculators_venv.sh (or set EAGLEWIRE_SPECULATORS_PYTHON)"
        )
    run.mkdir(parents=True, exist_ok=True)
    job = speculators_job(run, feats, vocab, batches, a)
    (run / "job.json").write_text(json.dumps(job))
    wall, peak = wait_peak(
        [str(SPEC_PY), str(HERE / "peer_speculators_arm.py"), str(run / "job.json")], run.with_suffix(".log")
    )
    # the trained model's own forward on one sample, for the import check of the scoring (peer_scoring.py)
    if not is_dflash(a):
        wait_peak(
            [str(SPEC_PY), str(HERE / "peer_speculators_arm.py"), "--probe", str(run / "job.json")],
            run.with_suffix(".probe.log"),
        )
    t = json.loads((run / "train.json").read_text())
    return {
        "wall_s": wall,
        "peak_rss_mb": peak,
        "tok_per_s": t["tok_per_s"],
        "tokens_seen": t["tokens"],
        "resolved_defaults": t["resolved_defaults"],
    }


def step_batches(train: list[Sample], steps: int, a: argparse.Namespace) -> list[list[Sample]]:
    """Exactly the batches `eaglewire train` takes (its own function, same seed and batch size), in order."""
    c = TrainConfig(max_steps=steps, batch_size=a.batch_size)
    return global_batches(train[: steps * a.batch_size], c, DistInfo(), 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=cache_root() / "peer_training")
    ap.add_argument("--budgets", type=int, nargs="+", default=[1, 3, 10])
    ap.add_argument("--base-steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--ttt", type=int, default=3, help="TTT depth of both arms (speculators' default)")
    ap.add_argument("--heldout", type=int, default=32, help="held-out samples scored")
    ap.add_argument("--prompts", type=int, default=8, help="MT-bench questions (spread over the categories)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--online",
        type=int,
        nargs="*",
        default=[],
        metavar="BUDGET",
        help="budgets also scored online (SpecDecoder; minutes per draft on one thread)",
    )
    ap.add_argument(
        "--arms", default="eaglewire,speculators", help=f"at every budget, of: speculators, {', '.join(ARMS)}"
    )
    ap.add_argument("--family", default="eagle3", choices=("eagle3", "dflash"), help="the drafter family trained")
    ap.add_argument("--block-size", type=int, default=8, help="dflash: tokens per block (both arms)")
    ap.add_argument("--anchors", type=int, default=32, help="dflash: anchors per sequence (speculators: x batch)")
    ap.add_argument("--extra", nargs="*", default=[], metavar="ARM@BUDGET", help="one more arm at one budget")
    a = ap.parse_args()
    for arm in a.arms.split(",") + [e.split("@")[0] for e in a.extra]:
        if arm not in (("eaglewire", "speculators") if is_dflash(a) else ARM_NORMS):
            raise SystemExit(f"unknown arm {arm!r}: expected one of {', '.join(ARM_NORMS)}")
    torch.set_num_threads(1)
    from benchmarks.peer_training.peer_scoring import Scorer, write_results

    a.work.mkdir(parents=True, exist_ok=True)
    target = load_target()
    target_settings(a, target)
    feats, vocab, train, held = prepare(a, target)
    scorer = Scorer(target, held, a)
    rows, plan = (
        [],
        [
            (b, arm)
            for i, b in enumerate(a.budgets)
            for arm in (a.arms.split(",") if i % 2 == 0 else a.arms.split(",")[::-1])
        ],
    )
    plan += [(int(e.split("@")[1]), e.split("@")[0]) for e in a.extra]
    for budget, arm in plan:
        rows.append(run_arm(arm, budget, a, feats, vocab, train, scorer))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "resolved_defaults"}), flush=True)
        write_results(rows, a)


def run_arm(
    arm: str, budget: int, a: argparse.Namespace, feats: Path, vocab: Path, train: list[Sample], scorer
) -> dict:
    """Train (unless done) and score (unless done) one arm at one budget; the row is kept in WORK/rows."""
    steps = a.base_steps * budget
    key = run_key(arm, budget, a)
    online = "-online" if budget in a.online else ""
    row_path = a.work / "rows" / f"{key}-p{a.prompts}-n{a.max_new_tokens}-h{a.heldout}{online}.json"
    if row_path.exists():
        return {**json.loads(row_path.read_text()), "norms": arm_norms(arm, a)}
    batches = step_batches(train, steps, a)
    run = a.work / "runs" / key
    done = run / "result.json"
    run.parent.mkdir(parents=True, exist_ok=True)
    if not done.exists():
        if arm == "speculators":
            r = train_speculators(run, feats, vocab, [[s.id for s in b] for b in batches], a)
        else:
            r = train_eaglewire(run, feats, vocab, steps, a, arm)
        # trained tokens: every real token of the step's samples, as both trainers count them (tokens/s too)
        r["tokens"] = sum(len(s.input_ids) for b in batches for s in b)
        done.write_text(json.dumps(r, indent=2))
    r = json.loads(done.read_text())
    row = {
        "arm": arm,
        "norms": arm_norms(arm, a),
        "family": a.family,
        "budget": budget,
        "steps": steps,
        **r,
        **scorer.score(arm, run, budget in a.online),
    }
    row_path.parent.mkdir(parents=True, exist_ok=True)
    row_path.write_text(json.dumps(row, indent=2))
    return row


if __name__ == "__main__":
    main()
