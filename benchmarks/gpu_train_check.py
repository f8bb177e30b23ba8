"""Training on a CUDA device: the checks a CPU machine cannot run, and what a GPU hour buys.

Checks (tiny random Llama target from tests/tiny.py, online features, so no model download):
  1. fp32 on CUDA (TF32 off) trains the same draft as fp32 on the CPU (device placement of draft, features,
     masks and optimizer state), within float tolerance;
  2. a run killed at step 3 and resumed on CUDA ends where an uninterrupted CUDA run ends (the trainer
     state goes to and from the device);
  3. bf16 autocast on CUDA (`dtype="auto"`) learns (the loss falls) and its checkpoint loads on the CPU.
Then throughput: TTT training at the embedded target's shapes (SmolLM2-135M: hidden 576, 30 layers,
vocab 49152; random weights, since no model travels here) with the released draft's settings (draft vocab
8000, TTT 3, batch 8), online features, in tokens per second as the trainer reports them.

    PYTHONPATH=src:tests python benchmarks/gpu_train_check.py --out gpu_train_check.json
    PYTHONPATH=src:tests python benchmarks/gpu_train_check.py --shape llama-8b --out gpu_train_check_8b.json
"""

from __future__ import annotations

import argparse
import json
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
    c = TrainConfig(max_steps=6, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=3, ckpt_every=3, ttt_steps=3,
                    dtype="fp32")
    _, cpu, _ = _run("cpu", c, tmp / "cpu")
    _, gpu, _ = _run(device, c, tmp / "gpu")
    _run(device, c, tmp / "killed", stop_at=3)
    _, resumed, _ = _run(device, c, tmp / "killed", resume=True)
    long = TrainConfig(max_steps=40, batch_size=4, lr=3e-3, warmup_steps=5, eval_every=20, ckpt_every=20,
                       ttt_steps=3, loss="forward_kl", dtype="auto")
    last, _, lines = _run(device, long, tmp / "bf16")
    first, final = (sum(r["loss"] for r in part) / len(part) for part in (lines[:5], lines[-5:]))
    res = {"cpu_vs_cuda_fp32_max_abs_diff": _max_diff(cpu, gpu),
           "resumed_vs_uninterrupted_cuda_max_abs_diff": _max_diff(resumed, gpu),
           "bf16_loss_first5": first, "bf16_loss_last5": final, "bf16_heldout_acc": last.get("acc")}
    res["ok"] = bool(res["cpu_vs_cuda_fp32_max_abs_diff"] < 1e-4 and res["resumed_vs_uninterrupted_cuda_max_abs_diff"]
                     < 1e-5 and final < 0.7 * first)
    return res


# Target shapes the throughput is measured at (random weights: nothing is downloaded), with the draft
# vocabulary size and taps a draft for it would have. llama-8b is Llama-3.1-8B's shape, loaded in bf16
# (16 GB) rather than fp32: what a GPU run of an 8B target does.
SHAPES = {
    "smollm2-135m": ({"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                      "num_attention_heads": 9, "num_key_value_heads": 3, "rope_theta": 100000.0,
                      "tie_word_embeddings": True}, 8000, (2, 15, 27), torch.float32),
    "llama-8b": ({"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
                  "tie_word_embeddings": False}, 32000, (2, 16, 29), torch.bfloat16),
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
    samples = [Sample(id=f"r{i}", input_ids=torch.randint(0, draft_vocab, (seq,), generator=g),
                      loss_mask=torch.ones(seq, dtype=torch.long)) for i in range(8 * steps + 16)]
    rows: list[dict] = []
    c = TrainConfig(max_steps=steps, batch_size=8, ttt_steps=3, eval_every=steps, ckpt_every=steps, dtype="auto")
    t0 = time.perf_counter()
    train(target, contract, vmap, feats, samples[:-16], samples[-16:], c, tmp / "tput", DistInfo(device=device),
          on_step=rows.append)
    wall = time.perf_counter() - t0
    rates = [r["tok_per_s"] for r in rows if r["split"] == "train" and "tok_per_s" in r]
    return {"shape": shape, "steps": steps, "seq": seq, "batch": 8, "wall_s": round(wall, 1),
            "tok_per_s_median": sorted(rates)[len(rates) // 2] if rates else None,
            "tok_per_s_last": rates[-1] if rates else None,
            "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu_train_check.json"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m",
                    help="the target shape the throughput is measured at (llama-8b: ~40 GB of GPU memory, estimated)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to dry-run this script's own logic")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check is for a GPU machine")
    import transformers

    res = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(0) if a.device == "cuda" else a.device}
    with tempfile.TemporaryDirectory() as d:
        res["checks"] = checks(Path(d), a.device)
        print(json.dumps(res, indent=2), flush=True)
        res["throughput"] = throughput(Path(d), a.steps, a.seq, a.device, a.shape)
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
