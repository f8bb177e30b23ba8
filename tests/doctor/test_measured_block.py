"""Measured wiring for block drafters (doctor/measured_block.py): a DFlash draft's own weights name the
boundaries it was trained on, with EAGLE-3's statistics and rule (trained_taps.compare).

A DFlash draft trained by eaglewire on TRAINED (random-token data, so it must read the taps), exported
without its contract: the healthy export gets no error; ids one layer early, and ids missing (the engines'
fallback formula), each get the error naming TRAINED; `eaglewire import` records the measured taps.
"""

import json

import pytest
import torch
from tiny import VOCAB, build_target

from eaglewire.capture.boundaries import sample_target
from eaglewire.capture.features import OnlineFeatures
from eaglewire.data.samples import Sample
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.doctor.measures import measure_wiring
from eaglewire.export.convert import export_draft

TRAINED = (2, 5, 7)  # z-lab ids [1, 4, 6] on an 8-layer target


def _random_samples(n, seed, T=24):
    g = torch.Generator().manual_seed(seed)
    return [
        Sample(
            id=f"r{i}", input_ids=torch.randint(0, 256, (T,), generator=g), loss_mask=torch.ones(T, dtype=torch.long)
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def target():
    t = build_target("llama", layers=8)
    with torch.no_grad():  # as test_doctor_measure.py: layers that write strongly, a sharp head
        for layer in t.layers:
            layer.self_attn.o_proj.weight.mul_(16)
            layer.mlp.down_proj.weight.mul_(16)
        t.model.lm_head.weight.mul_(30)
    return t


def _train(target, tmp_path_factory, vmap=None):
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.families import BlockWiring
    from eaglewire.train.loop import TrainConfig, train

    contract = dflash_contract(target, TRAINED, BlockWiring(block_size=4, mask_token_id=VOCAB - 1), vmap)
    samples = _random_samples(1000, 0)
    c = TrainConfig(
        family="dflash",
        block_size=4,
        anchors=8,
        max_steps=600,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        eval_every=10_000,
        ckpt_every=10_000,
        num_layers=1,
        loss="forward_kl",
        supervise="all",
    )
    out = tmp_path_factory.mktemp("dflash")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:-8], samples[-8:], c, out)
    finally:
        torch.set_num_threads(threads)
    return load_checkpoint(out / "draft", target=target), contract


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """A one-layer DFlash draft trained on TRAINED (~15 s on one thread)."""
    return _train(target, tmp_path_factory)


@pytest.fixture(scope="module")
def bounds(target):
    """Held-out random prompts, every position scored (the draft's training distribution)."""
    return sample_target(target, [s.input_ids for s in _random_samples(128, 1)], new_tokens=0, score_prompt=True)


def _export(tmp_path, trained, fmt="zlab", ids=None):
    draft, contract = trained
    out = export_draft(draft, contract, tmp_path / fmt, fmt)
    (out / "eaglewire_contract.json").unlink()
    cfg = json.loads((out / "config.json").read_text())
    if ids == "drop":
        del cfg["dflash_config"]["target_layer_ids"]
    elif ids is not None:
        cfg["dflash_config"]["target_layer_ids"] = ids
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("fmt", ["zlab", "sglang", "vllm"])
def test_a_healthy_block_export_without_contract_measures_its_taps(tmp_path, target, trained, bounds, fmt):
    m, (f,) = measure_wiring(inspect_dir(_export(tmp_path, trained, fmt), None), target, bounds=bounds)
    assert m.delivered == m.best == TRAINED and f.level == "info", m.to_dict()
    assert m.tau["best"] == m.tau["delivered"] and m.tau["best"][0] > 1.5 and len(m.tau["best"][1]) == 3


@pytest.mark.parametrize(
    "ids,delivered",
    [
        ([0, 3, 6], (1, 4, 7)),  # vLLM-style ids (no +1) in a z-lab config: every tap one layer early
        ("drop", (2, 4, 6)),  # no ids: the fallback formula SGLang guesses with (z-lab's default [1, 3, 5])
    ],
)
def test_mis_declared_block_taps_get_the_error_naming_the_trained_ones(
    tmp_path, target, trained, bounds, ids, delivered
):
    m, (f,) = measure_wiring(inspect_dir(_export(tmp_path, trained, "zlab", ids), None), target, bounds=bounds)
    assert m.best == TRAINED and m.delivered == delivered and f.level == "error", m.to_dict()
    mean, lo, hi = m.gap
    assert lo > 0.05 and lo <= mean <= hi and "99% paired block-bootstrap" in f.why
    assert f"predicts best from boundaries {list(TRAINED)}" in f.what and f"will deliver {list(delivered)}" in f.what
    assert "write dflash_config.target_layer_ids: [1, 4, 6]" in f.fix  # TRAINED in z-lab's numbering
    assert m.tau["best"][0] > m.tau["delivered"][0]


def test_a_reduced_vocabulary_export_measures_its_taps(tmp_path, tmp_path_factory, target, bounds):
    """A vLLM export with its own head over three quarters of the ids: the doctor scores its drafts as target ids
    (a token the vocabulary lacks is a miss) and still finds the trained taps, and the ids one layer early worse."""
    from eaglewire.draft.vocab import VocabMap

    vmap = VocabMap.from_target_ids(torch.tensor([i for i in range(VOCAB) if i % 4]), VOCAB)
    draft, contract = _train(target, tmp_path_factory, vmap)
    assert draft.reduced
    m, (f,) = measure_wiring(inspect_dir(_export(tmp_path, (draft, contract), "vllm"), None), target, bounds=bounds)
    assert m.delivered == m.best == TRAINED and f.level == "info", m.to_dict()
    assert 1.2 < m.tau["best"][0] and max(m.tau["best"][1]) < 1  # misses where the vocabulary lacks the token


def test_ids_the_engine_cannot_capture_are_an_error(tmp_path, target, trained, bounds):
    out = _export(tmp_path, trained, "zlab", [2, 5, 7])  # boundaries written as ids: z-lab's 7 is boundary 8
    m, (f,) = measure_wiring(inspect_dir(out, None), target, bounds=bounds)
    assert m.delivered is None and m.best == TRAINED and f.level == "error" and "cannot capture" in f.what


def test_the_engine_named_reads_its_own_field_and_convention(tmp_path, target, trained, bounds):
    """The same z-lab config read by SGLang (+1 always, as z-lab) is healthy; its ids as vLLM reads a
    speculators config's are not the question here: vLLM's dflash_config rule is +1 too."""
    out = _export(tmp_path, trained, "zlab")
    for engine in ("sglang", "vllm"):
        m, (f,) = measure_wiring(inspect_dir(out, engine), target, engine=engine, bounds=bounds)
        assert m.delivered == m.best == TRAINED and f.level == "info" and f.what.startswith(f"measured: {engine}")


def test_import_records_the_measured_block_taps(tmp_path, target, trained, bounds):
    from functools import partial

    from eaglewire.compose import load_draft
    from eaglewire.doctor.measures import measured_taps
    from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint

    broken = _export(tmp_path, trained, "zlab", [0, 3, 6])
    draft = load_draft(broken, target, fmt="zlab", measure=partial(measured_taps, bounds=bounds))
    contract = draft.contract
    ev = contract.inferred
    assert contract.taps == TRAINED and ev["delivered"] == [1, 4, 7]
    assert ev["source"] == "measured" and ev["best"] == list(TRAINED) and ev["error"] is True
    assert contract == trained[1]  # the inferred evidence is provenance only
    again = load_checkpoint(save_checkpoint(draft, contract, tmp_path / "native"), target=target)
    assert again.contract.inferred == ev
    fixed = export_draft(again, again.contract, tmp_path / "fixed", "zlab")
    assert json.loads((fixed / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [1, 4, 6]
    c2 = load_draft(broken, target).contract  # the config's ids as they are; the layout detected
    assert c2.taps == (1, 4, 7) and c2.inferred == {"source": "engine_config", "engine": "zlab"}


def test_measured_on_a_dump_with_the_vocab_as_with_the_target(tmp_path, target, trained, bounds):
    """`doctor sample --vocab` then `doctor check --boundaries`: the same Measurement as with the target; a
    dump without the target's head says how to re-sample instead of measuring."""
    from typer.testing import CliRunner

    from eaglewire.capture.boundary_file import DumpTarget, save_boundaries
    from eaglewire.cli.app import app

    out = _export(tmp_path, trained, "zlab", [0, 3, 6])
    ins = inspect_dir(out, None)
    m, found = measure_wiring(ins, target, bounds=bounds)
    dump = save_boundaries(
        bounds, tmp_path / "b.safetensors", target.identity, vocab=(target.embedding(), target.head_rows())
    )
    d, found_d = measure_wiring(ins, DumpTarget.from_file(dump))
    assert (d.best, d.delivered, d.gap, d.tau) == (m.best, m.delivered, m.gap, m.tau) and found_d == found
    r = CliRunner().invoke(app, ["doctor", str(out), "--boundaries", str(dump), "--json"])
    report = json.loads(r.stdout)
    assert r.exit_code == 1 and report["measurement"]["best"] == list(TRAINED), r.output
    assert report["measurement"]["delivered"] == [1, 4, 7]
    bare = save_boundaries(bounds, tmp_path / "bare.safetensors", target.identity)
    _, (f,) = measure_wiring(ins, DumpTarget.from_file(bare))
    assert f.level == "warn" and "no output head" in f.what and "--vocab" in f.fix


def test_a_family_without_a_measurement_record_is_said_not_measured(tmp_path, target, trained, monkeypatch):
    """A drafter family registered before its measurement exists gets an info finding naming it, not a crash
    and not EAGLE-3's measurement run on the wrong model."""
    from eaglewire.doctor import measures

    monkeypatch.setattr(measures, "MEASURED", {k: v for k, v in measures.MEASURED.items() if k != "dflash"})
    m, (f,) = measure_wiring(inspect_dir(_export(tmp_path, trained, "zlab"), None), target)
    assert m is None and f.level == "info" and "no measurement for the dflash family" in f.what


def test_our_engine_predicts_a_block_drafters_tau_at_the_engines_knobs(tmp_path, target, trained, bounds):
    """With the engine's knobs (vLLM num_speculative_tokens k), our engine decodes the built-in prompts with the
    delivered and the best sets through compose's proposer of the draft's family (the block proposer): the tau
    the front door's measure_tau gives the draft imported as it is, in the finding beside the teacher-forced
    one; ids one layer early decode on other taps, no better. The user compares it with the engine's logged
    accept length."""
    from eaglewire.compose import measure_tau
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.doctor.measured_tau import ENGINE_NEW_TOKENS, engine_prompts
    from eaglewire.export.convert import import_draft

    shape = TreeShape.chain(2)  # a block of 4 drafts 3; vLLM verifies the first 2
    out = _export(tmp_path, trained, "zlab")
    m, (f,) = measure_wiring(inspect_dir(out, None), target, bounds=bounds, shape=shape)
    tau, per_position = m.engine.tau["best"]
    assert m.delivered == m.best == TRAINED and m.engine.tau["delivered"] == (tau, per_position)
    assert len(per_position) == 2 and 1.0 < tau <= 3.0
    assert "our engine at vLLM num_speculative_tokens=2" in f.what and f"best {tau:.2f}" in f.what
    draft, _ = import_draft(out, "zlab", target=target)
    assert measure_tau(target, draft.float(), engine_prompts(target), shape, ENGINE_NEW_TOKENS).tau == tau
    early, _ = measure_wiring(
        inspect_dir(_export(tmp_path / "e", trained, "zlab", [0, 3, 6]), None), target, bounds=bounds, shape=shape
    )
    delivered = early.engine.tau["delivered"]  # decoded on other taps (the tiny target's gap is small: ~0.02)
    assert early.engine.tau["best"][0] == tau and delivered[0] <= tau and delivered != (tau, per_position)
    too_many, _ = measure_wiring(inspect_dir(out, None), target, bounds=bounds, shape=TreeShape.chain(4))
    assert "at most 3 tokens" in too_many.engine.skipped  # the block proposes B-1 = 3 per round
