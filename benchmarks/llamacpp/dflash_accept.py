"""Our DFlash draft in llama.cpp against our own engine: the same draft, the same prompt token ids, greedy, k
drafts per round; τ and per-position acceptance of each, and whether llama.cpp's output is its own plain output.

    python -m benchmarks.llamacpp.dflash_accept --work DIR --out benchmarks/results/llamacpp/<date>-<cpu>-dflash/

The draft: a comparison of conventions needs a draft that accepts, and a DFlash draft for the embedded target
that accepts on held-out prompts costs an hour of CPU training (benchmarks/results/dflash/). So the draft here is
trained on the very text it is then served on: the target's own greedy answers to the benchmark prompts (what
both engines will verify), a few hundred steps from the target's layers (`init_layers_from_target`). It is a
fixture for the comparison, not a draft to ship: its acceptance says nothing about held-out text.

Phases, each kept in --work (a rerun resumes): the target's greedy answers (answers.json), the training
(train/, resumable), our engine's decode (ours.json), the GGUF export, llama-server's decode (llamacpp.json).
One thread per engine; run it nice'd, the numbers are acceptance counts, never speed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch


def _answers(target: Any, prompts: list[torch.Tensor], max_new: int, path: Path) -> list[list[int]]:
    """The target's plain greedy continuation of each prompt (our fp32 runtime), kept in `path`."""
    from eaglewire.decoding.engine import greedy_reference
    from eaglewire.decoding.runtime import plain_runtime

    if path.is_file():
        return json.loads(path.read_text())
    rt = plain_runtime(target, max(p.shape[1] for p in prompts) + max_new + 32)
    out = [greedy_reference(rt, p, max_new, eos={target.tokenizer.eos_token_id}) for p in prompts]
    path.write_text(json.dumps(out))
    return out


def _train(
    target: Any, prompts: list[torch.Tensor], answers: list[list[int]], steps: int, anchors: int, out: Path
) -> Any:
    """A DFlash draft (block 4, z-lab's default taps, full vocabulary) trained on prompt + answer, every
    position supervised; resumes from `out`'s last checkpoint. The target's features of the fixed samples are
    computed once per batch order (the training shuffles the same few samples), not once per step."""
    from eaglewire.data.samples import Sample
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.train.dflash import default_taps, make_contract
    from eaglewire.train.loop import TrainConfig, train

    c = TrainConfig(
        family="dflash",
        block_size=4,
        anchors=anchors,
        max_steps=steps,
        batch_size=len(prompts),
        lr=3e-3,
        warmup_steps=10,
        eval_every=50,
        ckpt_every=25,
        num_layers=1,
        supervise="all",
        init_layers_from_target=True,
    )
    if not (out / "draft" / "model.safetensors").is_file():
        contract = make_contract(target, default_taps(target.num_layers), None, c)
        samples = [
            Sample(
                id=f"p{i}",
                input_ids=torch.cat([p[0], torch.tensor(a, dtype=torch.long)]),
                loss_mask=torch.ones(p.shape[1] + len(a), dtype=torch.long),
            )
            for i, (p, a) in enumerate(zip(prompts, answers))
        ]
        resume = (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir())
        train(target, contract, None, _Memo(target, contract, pad_id=0), samples, samples[:1], c, out, resume=resume)
    return load_checkpoint(out / "draft", target=target)


class _Memo:
    """OnlineFeatures, each batch's features kept: the samples never change, so neither do their features."""

    def __init__(self, target: Any, contract: Any, pad_id: int) -> None:
        from eaglewire.capture.features import OnlineFeatures

        self.online, self.memo = OnlineFeatures(target, contract, pad_id), {}
        self.stores_target_top1 = self.online.stores_target_top1

    def batch(self, samples: list[Any]) -> Any:
        key = tuple(s.id for s in samples)
        if key not in self.memo:
            self.memo[key] = self.online.batch(samples)
        return self.memo[key]


def _ours(
    target: Any, draft: Any, prompts: list[torch.Tensor], answers: list[list[int]], max_new: int, k: int
) -> dict[str, Any]:
    """Our engine: the block proposer at k drafts per round, greedy, its output checked equal to `answers`."""
    from eaglewire.decoding.block import BlockProposer
    from eaglewire.decoding.engine import SpecDecoder, SpecStats
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape

    max_len = max(p.shape[1] for p in prompts) + max_new + 32
    rt = plain_runtime(target, max_len)
    accepted, same = [], 0
    for p, plain in zip(prompts, answers, strict=True):
        prop = BlockProposer(draft, draft.contract, TreeShape.chain(k), max_len)
        toks, st = SpecDecoder(rt, prop).generate(p, max_new, eos={target.tokenizer.eos_token_id})
        same += toks == plain
        accepted += st.accepted
    st = SpecStats(accepted=accepted)
    return {
        "rounds": len(accepted),
        "accepted": sum(accepted),
        "tau": round(st.tau, 4),
        "per_position": [round(x, 4) for x in st.per_position(k)],
        "equal_to_plain": same,
    }


def _llamacpp(
    model: Path, draft_gguf: Path | None, prompts: list[list[int]], max_new: int, k: int, threads: int
) -> dict[str, Any]:
    """llama-server: each prompt's ids greedily, its speculative counters read before and after."""
    from eaglewire.serve.llamacpp import LlamaServer

    with LlamaServer(model, draft_gguf, spec_type="draft-dflash", n_max=k, threads=threads) as srv:
        before = srv.counters() if draft_gguf is not None else None
        out = [srv.complete(p, max_new) for p in prompts]
        after = srv.counters() if draft_gguf is not None else None
    row: dict[str, Any] = {"ids": [c.tokens for c in out]}
    if before is not None and after is not None:
        rounds = after.drafts - before.drafts
        per_pos = [
            a - b for a, b in zip(after.accepted_per_pos, before.accepted_per_pos or (0,) * len(after.accepted_per_pos))
        ]
        row.update(
            rounds=int(rounds),
            drafted=int(after.draft_tokens - before.draft_tokens),
            accepted=int(after.accepted - before.accepted),
            tau=round(1 + (after.accepted - before.accepted) / rounds, 4) if rounds else None,
            per_position=[round(x / rounds, 4) for x in per_pos] if rounds else None,
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="kept between runs: answers, training, GGUF")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=4, help="MT-bench questions, spread over the categories")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--anchors", type=int, default=32, help="blocks per sequence and step")
    ap.add_argument("--ks", default="3,1", help="drafts per round (block 4: at most 3)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--draft",
        type=Path,
        default=None,
        help="a checkpoint of the training (its draft/ folder) "
        "to compare instead of training to --steps (e.g. WORK/train/checkpoints/step-000075/draft)",
    )
    a = ap.parse_args()

    from eaglewire.export.convert import export_draft
    from eaglewire.hw import describe_cpu
    from eaglewire.serve.bench import bench_prompts
    from eaglewire.serve.llamacpp import llama_server_path, target_gguf
    from eaglewire.target.loader import load_target

    torch.set_num_threads(a.threads)
    a.work.mkdir(parents=True, exist_ok=True)
    target = load_target()
    prompts = bench_prompts(target, "mtbench", a.limit)
    answers = _answers(target, prompts, a.max_new_tokens, a.work / "answers.json")
    print("answers ready", flush=True)
    if a.draft is not None:
        from eaglewire.export.checkpoint import load_checkpoint

        draft = load_checkpoint(a.draft, target=target)
    else:
        draft = _train(target, prompts, answers, a.steps, a.anchors, a.work / "train")
    model = target_gguf("f32")
    gguf = export_draft(draft, draft.contract, a.work / "gguf", "llamacpp", vocab_from=model, force=True) / "draft.gguf"
    ids = [p[0].tolist() for p in prompts]
    plain = _llamacpp(model, None, ids, a.max_new_tokens, 1, a.threads)
    result: dict[str, Any] = {
        "cpu": describe_cpu(),
        "llama_server": str(llama_server_path()),
        "prompts": len(prompts),
        "max_new_tokens": a.max_new_tokens,
        "train_steps": a.steps,
        "anchors": a.anchors,
        "draft": str(a.draft) if a.draft is not None else "trained to --steps",
        "draft_contract": draft.contract.fingerprint(),
        "taps": list(draft.contract.taps),
        "block_size": draft.block.block_size,
        "llamacpp_plain_equals_ours": sum(x == y for x, y in zip(plain["ids"], answers)),
        "arms": {},
    }
    for k in (int(x) for x in a.ks.split(",")):
        ours = _ours(target, draft, prompts, answers, a.max_new_tokens, k)
        served = _llamacpp(model, gguf, ids, a.max_new_tokens, k, a.threads)
        served["lossless"] = sum(x == y for x, y in zip(served.pop("ids"), plain["ids"]))
        result["arms"][f"k{k}"] = {"ours": ours, "llamacpp": served}
        print(
            f"k={k}: ours tau {ours['tau']} {ours['per_position']}; llama.cpp tau {served['tau']} "
            f"{served['per_position']} lossless {served['lossless']}/{len(ids)}",
            flush=True,
        )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "dflash_accept.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
