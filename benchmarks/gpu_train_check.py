"""The whole job on a CUDA device, in one command: the checks a CPU machine cannot run, and what a GPU hour buys.

    PYTHONPATH=src:tests python benchmarks/gpu_train_check.py --out gpu_train_check.json
    PYTHONPATH=src:tests python benchmarks/gpu_train_check.py --shape llama-8b --out gpu_train_check_8b.json

Nothing is downloaded: the target is a small Llama the script builds (random weights, its head sharpened so
greedy answers are decisive) with a byte-level tokenizer and a ChatML template made in-process, saved as an HF
directory. On a machine without CUDA it refuses at once (exit 2) and says so.

1. The whole job (`eaglewire run`'s pipeline, --device cuda): regenerate (HF generate on the GPU), capture,
   vocab, train, export, doctor, bench; per stage its wall time and the CUDA memory it allocated beyond what
   was resident when it started (a stage that ran on the CPU allocates none), asserted for the stages that run
   the target or the draft;
2. lossless greedy: the trained draft decoding on the GPU (fp32, TF32 off), chain and tree, gives exactly the
   target's plain greedy tokens;
3. training checks: fp32 on CUDA trains the same draft as fp32 on the CPU; a run killed at step 3 and resumed
   on CUDA ends where an uninterrupted one ends; bf16 autocast learns and its checkpoint loads on the CPU;
4. throughput: TTT training at the embedded target's shapes (or Llama-3.1-8B's, --shape llama-8b), online
   features, tokens per second as the trainer reports them, and peak memory.

One JSON (--out) for benchmarks/results/training/<date>-<gpu>/; `ok` is true only when every assertion held.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from eaglewire.export.checkpoint import load_checkpoint
from eaglewire.capture.features import OnlineFeatures
from eaglewire.data.samples import Sample
from eaglewire.train.dist import DistInfo
from eaglewire.train.loop import TrainConfig, train
from eaglewire.target.loader import wrap_model
from eaglewire.draft.vocab import VocabMap

TAPS = (1, 2, 3)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the stages that run the target or the draft: each must allocate CUDA memory of its own
GPU_STAGES = ("regenerate", "features", "train", "bench")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --- 1. the whole job ---------------------------------------------------------------------------------------
def build_small_target(out: Path, hidden: int, layers: int) -> Path:
    """A small Llama with a byte-level tokenizer and a ChatML template, saved as an HF directory: a target
    the whole pipeline can run (regeneration needs a chat template) with nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer, core.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    core.add_special_tokens(["<|im_start|>", "<|im_end|>", "<pad>"])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<pad>", chat_template=CHATML
    )
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64 or 64,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a random target is nearly uniform; a sharper head makes its greedy choices decisive
        model.lm_head.weight.mul_(30)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _measured(stage, device: str, into: dict):
    """`stage` with its wall time and the CUDA memory it allocated beyond what was resident at its start."""
    import dataclasses

    def fn(ctx, work):
        _sync(device)
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        base, t0 = torch.cuda.memory_allocated() if cuda else 0, time.perf_counter()
        result = stage.fn(ctx, work)
        _sync(device)
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else None
        into[stage.name] = {
            "seconds": round(time.perf_counter() - t0, 2),
            "cuda_peak_beyond_resident_mib": None if extra is None else round(extra, 1),
            "target_device": str(ctx.target.device),
        }
        return result

    return dataclasses.replace(stage, fn=fn)


def whole_job(tmp: Path, target_dir: Path, device: str, conversations: int, steps: int, bench_tokens: int) -> dict:
    """`eaglewire run` on the small target, every stage measured; the run's summary and the stage table."""
    from eaglewire.pipeline import runner
    from eaglewire.pipeline.config import resolve

    cfg = resolve(
        "quick",
        None,
        target=str(target_dir),
        device=device,
        data={
            "source": "smollm2-regen",
            "conversations": conversations,
            "max_new_tokens": 64,
            "max_prompt_tokens": 2048,
            "max_length": 1024,
            "use_shipped": False,
            "engine": "local",
        },
        vocab={"draft_vocab_size": 200},
        train={
            "features": "offline",
            "max_steps": steps,
            "init_from": "",
            "eval_every": steps // 2,
            "ckpt_every": steps // 2,
            "warmup_steps": 5,
            "batch_size": 4,
        },
        bench={
            "source": "mtbench",
            "prompts": 4,
            "max_new_tokens": bench_tokens,
            "tau_prompts": 2,
            "methods": ("vanilla", "eagle_chain"),
            "vllm": "off",
        },
    )
    stages: dict[str, dict] = {}
    saved = runner.STAGES
    runner.STAGES = tuple(_measured(st, device, stages) for st in saved)
    try:
        t0 = time.perf_counter()
        summary = runner.run_pipeline(cfg, tmp / "run", progress=lambda *a: None, log=lambda line: print(line))
    finally:
        runner.STAGES = saved
    for name in GPU_STAGES:
        extra = stages[name]["cuda_peak_beyond_resident_mib"]
        stages[name]["ran_on_gpu"] = None if extra is None else extra > 1.0
    return {
        "wall_s": round(time.perf_counter() - t0, 1),
        "stages": stages,
        "doctor_errors": summary["doctor_errors"],
        "verdict": summary["verdict"],
        "ok": all(stages[n].get("ran_on_gpu") is not False for n in GPU_STAGES)
        and not sum(summary["doctor_errors"].values()),
    }


# --- 2. lossless greedy on the device -----------------------------------------------------------------------
def lossless(run_dir: Path, target_dir: Path, device: str, prompts: int = 4, new_tokens: int = 48) -> dict:
    """The trained draft on the device, fp32 target (TF32 off): chain and tree decoding equal plain greedy."""
    from eaglewire.compose import decoder
    from eaglewire.decoding.engine import greedy_reference
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.target.loader import load_target

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    target = load_target(str(target_dir), dtype=torch.float32, device=device)
    draft = load_checkpoint(next((run_dir / "work").glob("train-*")) / "draft", target=target)
    g = torch.Generator().manual_seed(1)
    rows, same = [], True
    for i in range(prompts):
        ids = torch.randint(0, 256, (1, 16 + 8 * i), generator=g)
        ref = greedy_reference(plain_runtime(target, 256), ids, new_tokens)
        for shape in (TreeShape.chain(3), TreeShape(num_steps=3, topk=2, num_draft_tokens=6)):
            out, st = decoder(target, draft, shape, new_tokens, context=256, accelerate=False).generate(ids, new_tokens)
            same &= out == ref
            rows.append(
                {
                    "prompt": i,
                    "shape": [shape.num_steps, shape.topk, shape.num_draft_tokens],
                    "equal": out == ref,
                    "tau": round(st.tau, 3),
                }
            )
    return {"device": str(target.device), "rows": rows, "ok": bool(same)}


# --- 3. training checks -------------------------------------------------------------------------------------


def _tiny(device: str):
    from tiny import build_target

    target = build_target("llama")
    with torch.no_grad():  # a random tiny target is nearly uniform; sharpen it so there is something to learn
        target.model.lm_head.weight.mul_(30)
    target.model.to(device)
    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    contract = target.contract(TAPS, vocab_map=vmap)
    return target, vmap, contract, OnlineFeatures(target, contract, pad_id=0)


def _run(device: str, c: TrainConfig, out: Path, **kw) -> tuple[dict, dict[str, torch.Tensor], list[dict]]:
    from tiny import tiny_samples

    target, vmap, contract, feats = _tiny(device)
    samples = tiny_samples(32)
    last = train(target, contract, vmap, feats, samples[:28], samples[28:], c, out, DistInfo(device=device), **kw)
    if "stop_at" in kw:  # killed: no draft written yet
        return last, {}, []
    cpu_target = _tiny("cpu")[0]
    weights = load_checkpoint(out / "draft", target=cpu_target).state_dict()  # loads on the CPU
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return last, weights, [r for r in lines if r["split"] == "train"]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def checks(tmp: Path, device: str) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    c = TrainConfig(
        max_steps=6, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=3, ckpt_every=3, ttt_steps=3, dtype="fp32"
    )
    _, cpu, _ = _run("cpu", c, tmp / "cpu")
    _, gpu, _ = _run(device, c, tmp / "gpu")
    _run(device, c, tmp / "killed", stop_at=3)
    _, resumed, _ = _run(device, c, tmp / "killed", resume=True)
    long = TrainConfig(
        max_steps=40,
        batch_size=4,
        lr=3e-3,
        warmup_steps=5,
        eval_every=20,
        ckpt_every=20,
        ttt_steps=3,
        loss="forward_kl",
        dtype="auto",
    )
    last, _, lines = _run(device, long, tmp / "bf16")
    first, final = (sum(r["loss"] for r in part) / len(part) for part in (lines[:5], lines[-5:]))
    res = {
        "cpu_vs_cuda_fp32_max_abs_diff": _max_diff(cpu, gpu),
        "resumed_vs_uninterrupted_cuda_max_abs_diff": _max_diff(resumed, gpu),
        "bf16_loss_first5": first,
        "bf16_loss_last5": final,
        "bf16_heldout_acc": last.get("acc"),
    }
    res["ok"] = bool(
        res["cpu_vs_cuda_fp32_max_abs_diff"] < 1e-4
        and res["resumed_vs_uninterrupted_cuda_max_abs_diff"] < 1e-5
        and final < 0.7 * first
    )
    return res


# Target shapes the throughput is measured at (random weights: nothing is downloaded), with the draft
# vocabulary size and taps a draft for it would have. llama-8b is Llama-3.1-8B's shape, loaded in bf16
# (16 GB) rather than fp32: what a GPU run of an 8B target does.
SHAPES = {
    "smollm2-135m": (
        {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "rope_theta": 100000.0,
            "tie_word_embeddings": True,
        },
        8000,
        (2, 15, 27),
        torch.float32,
    ),
    "llama-8b": (
        {
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
        },
        32000,
        (2, 16, 29),
        torch.bfloat16,
    ),
}


def throughput(tmp: Path, steps: int, seq: int, device: str, shape: str = "smollm2-135m") -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes, draft_vocab, taps, dtype = SHAPES[shape]
    cfg = LlamaConfig(max_position_embeddings=8192, **sizes)
    torch.manual_seed(0)
    target = wrap_model(LlamaForCausalLM(cfg).to(dtype).eval(), name=f"{shape}-shaped-random")
    target.model.to(device)
    vmap = VocabMap.from_target_ids(torch.arange(0, draft_vocab), sizes["vocab_size"])
    contract = target.contract(taps, vocab_map=vmap)
    feats = OnlineFeatures(target, contract, pad_id=0)
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(
            id=f"r{i}",
            input_ids=torch.randint(0, draft_vocab, (seq,), generator=g),
            loss_mask=torch.ones(seq, dtype=torch.long),
        )
        for i in range(8 * steps + 16)
    ]
    rows: list[dict] = []
    c = TrainConfig(max_steps=steps, batch_size=8, ttt_steps=3, eval_every=steps, ckpt_every=steps, dtype="auto")
    t0 = time.perf_counter()
    train(
        target,
        contract,
        vmap,
        feats,
        samples[:-16],
        samples[-16:],
        c,
        tmp / "tput",
        DistInfo(device=device),
        on_step=rows.append,
    )
    wall = time.perf_counter() - t0
    rates = [r["tok_per_s"] for r in rows if r["split"] == "train" and "tok_per_s" in r]
    return {
        "shape": shape,
        "steps": steps,
        "seq": seq,
        "batch": 8,
        "wall_s": round(wall, 1),
        "tok_per_s_median": sorted(rates)[len(rates) // 2] if rates else None,
        "tok_per_s_last": rates[-1] if rates else None,
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
    }


NO_CUDA = (
    "gpu_train_check: no CUDA device is visible to torch {version} (CUDA build: {cuda}); this check runs "
    "the whole job on a GPU and proves nothing on a CPU. Run it on a GPU machine with torch's CUDA build "
    "(docs/guides/gpu.md), or pass --device cpu to dry-run the script's own logic."
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_train_check.json"))
    ap.add_argument("--steps", type=int, default=60, help="throughput: training steps measured")
    ap.add_argument("--seq", type=int, default=1024, help="throughput: tokens per sample")
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="smollm2-135m",
        help="the target shape the throughput is measured at (llama-8b: ~40 GB of GPU memory, estimated)",
    )
    ap.add_argument("--hidden", type=int, default=512, help="the whole job's small target: hidden size")
    ap.add_argument("--layers", type=int, default=8, help="the whole job's small target: decoder layers")
    ap.add_argument("--conversations", type=int, default=32, help="the whole job: conversations regenerated")
    ap.add_argument("--job-steps", type=int, default=40, help="the whole job: training steps")
    ap.add_argument("--bench-tokens", type=int, default=128, help="the whole job: new tokens per bench prompt")
    ap.add_argument("--parts", default="job,lossless,checks,throughput", help="which parts run (comma list)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to dry-run this script's own logic")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(NO_CUDA.format(version=torch.__version__, cuda=torch.version.cuda or "none"), file=sys.stderr)
        raise SystemExit(2)
    if a.device == "cpu":  # a dry run checks this script's logic: no minutes of CPU kernel compilation
        os.environ.setdefault("EAGLEWIRE_FASTCPU", "0")
    import transformers

    parts = set(a.parts.split(","))
    res: dict = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else a.device,
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if parts & {"job", "lossless"}:
            target_dir = build_small_target(tmp / "target", a.hidden, a.layers)
            res["job"] = whole_job(tmp, target_dir, a.device, a.conversations, a.job_steps, a.bench_tokens)
            if "lossless" in parts:
                res["lossless"] = lossless(tmp / "run", target_dir, a.device)
            print(json.dumps(res, indent=2), flush=True)
        if "checks" in parts:
            res["checks"] = checks(tmp, a.device)
            print(json.dumps(res, indent=2), flush=True)
        if "throughput" in parts:
            res["throughput"] = throughput(tmp, a.steps, a.seq, a.device, a.shape)
    res["ok"] = all(res[k]["ok"] for k in ("job", "lossless", "checks") if k in res)
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    if not res["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
