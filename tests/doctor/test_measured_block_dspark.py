"""Measured wiring of a DSpark draft's backbone (doctor/measured_block.py through the family records of
doctor/block_inspect.py READ_FAMILIES): DSpark's anchor layout (slot k of the block anchored at p predicts p+k+1,
B drafts) is its family record's, so the same measurement as DFlash's scores it with its own label offset.

speculators' DSpark trainer needs a GPU (flex attention, verifier states served by vLLM), so the draft is trained
here, on TRAINED of the 8-layer tiny target, by the measurement's own teacher-forced block objective in the
anchor-first layout; it is written as our vLLM (speculators) export rewritten as speculators' DSparkSpeculatorConfig
names it (speculators_model_type dspark, sample_from_anchor true) with a Markov and a confidence head's weights
(speculators' DSparkDraftModel names) beside the backbone, which the backbone measurement sets aside.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from test_measured_block import TRAINED, _random_samples, bounds, target  # noqa: F401  (module fixtures)
from tiny import VOCAB

from eaglewire.capture.boundaries import sample_target
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.doctor.measures import measure_wiring
from eaglewire.families import BlockWiring
from eaglewire.draft.blocks import block_inputs, block_mask, block_positions

B, MASK, RANK = 4, VOCAB - 1, 8


def _train_anchor_first(target, steps=500, seed=0):
    """A one-layer draft whose slot k learns the target's token after p+k (~15 s on one thread)."""
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract

    block = BlockWiring(B, MASK, anchor_layout="anchor_first")
    draft = build_dflash_draft(target, dflash_contract(target, TRAINED, block), 1, seed=seed)
    data = sample_target(target, [s.input_ids for s in _random_samples(512, 0)], new_tokens=0, score_prompt=True)
    ctx = data.taps(TRAINED)  # [N, T, 3H]
    T = ctx.shape[1]
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            rows = torch.randint(0, ctx.shape[0], (8,), generator=g)  # [8]
            anchors = torch.stack([torch.randperm(T - B - 1, generator=g)[:8] + 1 for _ in rows]).sort(-1).values
            hidden = draft(
                ctx[rows],
                torch.arange(T)[None].expand(8, -1),
                block_inputs(data.input_ids[rows], anchors, B, MASK),
                block_positions(anchors, B),
                block_mask(anchors, T, B),
            )  # [8, 8B, H]
            labels = data.labels[rows].gather(1, block_positions(anchors, B))  # [8, 8B] slot k: the label at p+k
            loss = F.cross_entropy(draft.logits(hidden).flatten(0, 1).float(), labels.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return draft


@pytest.fixture(scope="module")
def dspark_dir(target, tmp_path_factory):
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.export.convert import export_draft

    trained = _train_anchor_first(target)
    # our exporter writes the bonus layout only: the same weights, declared anchor-first in the config below
    contract = dflash_contract(target, TRAINED, BlockWiring(B, MASK))
    writer = build_dflash_draft(target, contract, 1)
    writer.load_state_dict(trained.state_dict())
    out = export_draft(writer, contract, tmp_path_factory.mktemp("dspark") / "vllm", "vllm")
    (out / "eaglewire_contract.json").unlink()
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(
        speculators_model_type="dspark",
        architectures=["DSparkSpeculator"],
        sample_from_anchor=True,
        markov_rank=RANK,
        markov_head_type="vanilla",
        enable_confidence_head=True,
    )
    (out / "config.json").write_text(json.dumps(cfg))
    weights = load_file(out / "model.safetensors")
    H = cfg["transformer_layer_config"]["hidden_size"]
    g = torch.Generator().manual_seed(1)
    weights.update(
        {
            "markov_head.markov_w1.weight": torch.randn(VOCAB, RANK, generator=g),
            "markov_head.markov_w2.weight": torch.randn(VOCAB, RANK, generator=g),
            "confidence_head.proj.weight": torch.randn(1, H, generator=g),
            "confidence_head.proj.bias": torch.zeros(1),
        }
    )
    save_file({k: v.contiguous() for k, v in weights.items()}, out / "model.safetensors")
    return out


def _edit(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_dspark_drafts_backbone_is_measured_back_to_its_taps(target, bounds, dspark_dir):  # noqa: F811
    m, (f,) = measure_wiring(inspect_dir(dspark_dir, None), target, bounds=bounds)
    assert m is not None and m.delivered == m.best == TRAINED and f.level == "info", f
    tau, per_slot = m.tau["best"]
    assert len(per_slot) == B and tau > 1.5  # anchor-first: B drafted slots, slot 0 among them


def test_dspark_ids_one_layer_early_get_the_error_naming_the_trained_taps(
    tmp_path,
    target,
    bounds,  # noqa: F811
    dspark_dir,
):
    early = _edit(dspark_dir, tmp_path / "early", aux_hidden_state_layer_ids=[b - 1 for b in TRAINED])
    m, (f,) = measure_wiring(inspect_dir(early, None), target, bounds=bounds)
    assert m.best == TRAINED and m.delivered == tuple(b - 1 for b in TRAINED) and f.level == "error", m.to_dict()
    assert f"predicts best from boundaries {list(TRAINED)}" in f.what


def test_the_family_records_label_offset_is_the_one_scored(tmp_path, target, bounds, dspark_dir):  # noqa: F811
    """The same weights read in DFlash's layout (sample_from_anchor false) are scored as DFlash's: slot 0 is the
    anchor, B-1 drafts per round, one scored slot fewer per anchor. (The two readings' scores are close here:
    past the first slot the tiny target's greedy labels on random prompts are mostly one token.)"""
    m, _ = measure_wiring(inspect_dir(dspark_dir, None), target, bounds=bounds)
    wrong = _edit(dspark_dir, tmp_path / "bonus", sample_from_anchor=False)
    w, _ = measure_wiring(inspect_dir(wrong, None), target, bounds=bounds)
    assert len(m.tau["best"][1]) == B and len(w.tau["best"][1]) == B - 1
    assert w.tokens < m.tokens, (w.tokens, m.tokens)
