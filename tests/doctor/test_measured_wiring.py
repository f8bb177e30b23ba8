"""The measured wiring check: a draft's own weights name the boundaries it was trained on.

The seeds' cases end to end: a draft trained by eaglewire on a tiny target, exported for each engine,
its contract file removed, its ids broken the ways the seeds' were (SGLang numbering given to vLLM = -1,
the embedding tap shifted in, missing ids, ids SGLang reads +1) — each diagnosed with the trained
boundaries named; the healthy export without its contract gets no error. +1 on this tiny target is not
asserted: its gap (0.075 nats, 99% low end 0.026) is inside the margin. The last test is the one
real-target test of this file.
"""

import json
from dataclasses import replace

import pytest
import torch
from tiny import build_target

from eaglewire.capture.features import OnlineFeatures
from eaglewire.data.samples import Sample
from eaglewire.decoding.propose import EagleProposer
from eaglewire.decoding.tree import TreeShape
from eaglewire.doctor.checks import run_checks
from eaglewire.doctor.measured_wiring import run_measurement
from eaglewire.doctor.measured_tau import ENGINE_NEW_TOKENS, engine_prompts
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.capture.boundaries import sample_target
from eaglewire.export.convert import export_draft
from eaglewire.train.loop import TrainConfig, train
from eaglewire.draft.vocab import VocabMap

TRAINED = (2, 4, 6)


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
    with torch.no_grad():
        # A random tiny model barely changes its residual stream per layer (all boundaries look alike) and is
        # nearly uniform: make each layer write strongly, as a trained model's do, and sharpen the head.
        for layer in t.layers:
            layer.self_attn.o_proj.weight.mul_(16)
            layer.mlp.down_proj.weight.mul_(16)
        t.model.lm_head.weight.mul_(30)
    return t


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """A draft trained by eaglewire on TRAINED (random-token data, so it must read the taps: ~10 s)."""
    from eaglewire.export.checkpoint import load_checkpoint

    vmap = VocabMap.from_target_ids(torch.arange(0, 256, 2), 256)
    contract = target.contract(TRAINED, vocab_map=vmap)
    samples = _random_samples(1000, 0)
    c = TrainConfig(
        max_steps=600,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        eval_every=10_000,
        ckpt_every=10_000,
        ttt_steps=2,
        loss="forward_kl",
        supervise="all",
    )
    out = tmp_path_factory.mktemp("trained")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's other work makes two threads slower here, not faster
    try:
        train(target, contract, vmap, OnlineFeatures(target, contract, pad_id=0), samples[:-8], samples[-8:], c, out)
    finally:
        torch.set_num_threads(threads)
    return load_checkpoint(out / "draft", target=target), contract


@pytest.fixture(scope="module")
def bounds(target):
    """Held-out random prompts, every position scored (the draft's training distribution): ~6k tokens."""
    return sample_target(target, [s.input_ids for s in _random_samples(256, 1)], new_tokens=0, score_prompt=True)


def _export(tmp_path, trained, fmt, ids=None):
    draft, contract = trained
    out = export_draft(draft, contract, tmp_path / fmt, fmt)
    (out / "eaglewire_contract.json").unlink()
    cfg = json.loads((out / "config.json").read_text())
    if ids == "drop":
        (cfg.get("eagle_config") or cfg).pop("eagle_aux_hidden_state_layer_ids")
    elif ids is not None:
        (cfg.get("eagle_config") or cfg)["eagle_aux_hidden_state_layer_ids"] = ids
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _measured(out, target, bounds, engine):
    ins = inspect_dir(out, engine)
    m, findings = run_measurement(ins, target, bounds, chain_steps=2)
    return m, findings[0], run_checks(ins, target)


@pytest.mark.parametrize(
    "fmt,engine,ids,delivered",
    [
        ("vllm", "vllm", [1, 3, 5], (1, 3, 5)),  # SGLang's numbering given to vLLM: every tap one layer early
        ("vllm", "vllm", [0, 2, 4], (0, 2, 4)),  # the embedding shifted in ([embed, l3, l31] vs [l3, l31, l59])
        ("vllm", "vllm", "drop", (2, 4, 5)),  # no ids: vLLM's default taps
        ("sglang", "sglang-legacy", [1, 2, 4], (2, 3, 5)),  # vLLM-style ids off by one, read by SGLang's +1 rule
        ("sglang", "sglang", [0, 1, 3], (1, 2, 4)),  # the ids PR #25454's rule would read as is: llama.py adds 1
    ],
)
def test_broken_ids_are_diagnosed_with_the_trained_boundaries(
    tmp_path, target, trained, bounds, fmt, engine, ids, delivered
):
    m, f, _ = _measured(_export(tmp_path, trained, fmt, ids), target, bounds, engine)
    assert m.best == TRAINED, m.to_dict()
    assert m.delivered == delivered and f.level == "error", f
    assert f"predicts best from boundaries {list(TRAINED)}" in f.what
    if delivered is not None:
        mean, lo, hi = m.gap
        assert lo > 0.05 and lo <= mean <= hi and f"will deliver {list(delivered)}" in f.what
        assert "99% paired block-bootstrap" in f.why


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "sglang-legacy", "specforge"])
def test_healthy_export_without_contract_has_no_error(tmp_path, target, trained, bounds, fmt):
    m, f, report = _measured(_export(tmp_path, trained, fmt), target, bounds, fmt)
    assert m.delivered == m.best == TRAINED and f.level == "info", m.to_dict()
    assert [x for x in report.findings if x.level == "error"] == []
    assert m.tau["best"] == m.tau["delivered"] and m.tau["best"][0] > 1.3  # a 2-chain accepts something


def test_an_untrained_draft_is_weak_evidence(tmp_path, target, bounds):
    from tiny import build_draft

    draft, contract = build_draft(target, taps=TRAINED, seed=3)
    out = export_draft(draft, contract, tmp_path / "v", "vllm")
    (out / "eaglewire_contract.json").unlink()
    m, f, _ = _measured(out, target, bounds, "vllm")
    assert m.weak and "Weak evidence" in f.why


def test_cli_measures_by_default_with_a_target_and_not_without(tmp_path, target, trained):
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    target.model.save_pretrained(tmp_path / "t")
    out = _export(tmp_path, trained, "vllm", [0, 2, 4])
    args = ["doctor", str(out), "--engine", "vllm", "--target", str(tmp_path / "t"), "--json", "--steps", "2"]
    r = CliRunner().invoke(app, args)
    assert r.stdout.strip(), (r.exit_code, r.output, r.exception)
    report = json.loads(r.stdout)
    assert r.exit_code == 1 and report["measurement"]["delivered"] == [0, 2, 4], r.output
    assert any(f["check"] == "measured_wiring" and f["level"] == "error" for f in report["findings"])
    # not a terminal: one progress line per phase with the seconds elapsed, so a CI log is not silent
    phases = [line for line in r.stderr.splitlines() if "doctor: measuring the wiring" in line]
    assert len(phases) >= 4 and " s] " in phases[0] and "greedily" in phases[1] and phases[-1].endswith("done")
    # the no-contract INFO says the boundaries were measured, never "give --target" once it was given
    (info,) = [f for f in report["findings"] if f["check"] == "contract"]
    assert "--target to measure" not in info["fix"] and "were measured on the target" in info["why"], info
    r = CliRunner().invoke(app, args + ["--no-measure"])
    assert json.loads(r.stdout)["measurement"] is None
    (info,) = [f for f in json.loads(r.stdout)["findings"] if f["check"] == "contract"]
    assert "give --target to measure" in info["fix"]  # not measured: the INFO still says how to
    r = CliRunner().invoke(app, args + ["--num-steps", "2", "--topk", "2", "--num-draft-tokens", "4"])
    tau = json.loads(r.stdout)["measurement"]["tau"]  # SGLang's tree knobs: our engine at that shape
    assert tau["best_engine"]["tau"] > tau["delivered_engine"]["tau"] and tau["best_engine"]["shape"]["topk"] == 2
    assert len(tau["best"]["per_step"]) == 2  # --steps 2 still sets the teacher-forced chain beside it
    r = CliRunner().invoke(app, args + ["--no-measure", "--num-speculative-tokens", "2"])
    assert r.exit_code != 0 and "--no-measure" in r.output  # knobs are never silently ignored


TREE = TreeShape(num_steps=2, topk=2, num_draft_tokens=4)  # SGLang S=2 K=2 N=4: a tree no chain score predicts


def test_engine_tau_at_a_tree_shape_from_our_engine(tmp_path, target, trained, bounds):
    """At SGLang's tree knobs our engine decodes with the delivered and the trained boundaries: the
    broken export's delivered set accepts less, the healthy one's the same; the figures are exactly what
    doctor expect's runner gives for the same contract, prompts and shape."""
    from eaglewire.compose import load_draft
    from eaglewire.doctor.expect import predict

    broken = _export(tmp_path / "b", trained, "vllm", [0, 2, 4])
    m, (f,) = run_measurement(inspect_dir(broken, "vllm"), target, bounds, chain_steps=2, shape=TREE)
    delivered, best = m.engine.tau["delivered"], m.engine.tau["best"]
    assert m.best == TRAINED and best[0] > delivered[0] + 0.05, m.to_dict()["tau"]  # 1.91 vs 1.77
    assert m.tau["best"] and m.tau["delivered"]  # the teacher-forced chain stays beside it
    assert "--speculative-eagle-topk 2 --speculative-num-draft-tokens 4" in f.what
    assert f"delivered {delivered[0]:.2f}" in f.what and f"best {best[0]:.2f}" in f.what
    entry = m.to_dict()["tau"]["delivered_engine"]
    assert entry["shape"] == {"num_steps": 2, "topk": 2, "num_draft_tokens": 4} and len(entry["per_position"]) == 2
    # `doctor expect --draft broken`: the export as vLLM reads it (contract taps [0, 2, 4]), called directly
    draft = load_draft(broken, target)
    contract = draft.contract
    assert contract.taps == (0, 2, 4) and contract.inferred == {"source": "engine_config", "engine": "vllm"}
    assert predict(target, draft, contract, TREE, engine_prompts(target), ENGINE_NEW_TOKENS) == delivered
    proposer = EagleProposer(draft, TREE, 64, contract=replace(contract, taps=TRAINED))
    assert proposer.taps == TRAINED  # the engine asks the target for the contract's taps

    healthy = inspect_dir(_export(tmp_path / "h", trained, "vllm"), "vllm")
    m, (f,) = run_measurement(healthy, target, bounds, chain_steps=2, shape=TREE)
    assert m.delivered == m.best == TRAINED and f.level == "info"
    assert m.engine.tau["delivered"] == m.engine.tau["best"] == best  # the same weights fed the same set


def test_engine_tau_names_a_delivered_set_the_engine_cannot_capture(tmp_path, target, trained, bounds):
    ins = inspect_dir(_export(tmp_path, trained, "sglang", [1, 3, 7]), "sglang")  # llama.py cannot capture boundary L
    m, (f,) = run_measurement(ins, target, bounds, chain_steps=2, shape=TREE)
    assert m.delivered is None and m.engine.tau["delivered"] is None and m.engine.tau["best"][0] > 1.3
    assert "delivered: none (the engine cannot capture it)" in f.what, f.what
    assert m.to_dict()["tau"]["delivered_engine"] is None


@pytest.mark.real_target
def test_released_draft_on_the_embedded_target(tmp_path):
    """The one real-target test here: the released draft (trained on [2, 15, 27]) exported for vLLM without
    its contract; SGLang's numbering [1, 14, 26] is an error naming [2, 15, 27]; the healthy ids are not."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads beside the machine's other work take 4x longer here
    try:
        _released(tmp_path)
    finally:
        torch.set_num_threads(threads)


def _released(tmp_path):
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.target.loader import load_target

    smollm = load_target()
    draft = load_checkpoint(resolve_draft(None), target=smollm)
    released = (draft, draft.contract)
    sample = sample_target(smollm)  # the built-in prompts and the target's greedy answers (~600 tokens)
    m, f, _ = _measured(_export(tmp_path / "a", released, "vllm", [1, 14, 26]), smollm, sample, "vllm")
    assert f.level == "error" and m.best == (2, 15, 27) and "will deliver [1, 14, 26]" in f.what, f
    m, f, report = _measured(_export(tmp_path / "b", released, "vllm"), smollm, sample, "vllm")
    assert f.level == "info" and m.delivered == m.best == (2, 15, 27), f
    assert [x for x in report.findings if x.level == "error"] == []


def test_weights_nan_in_fc_zero_norm_and_copied_head(tmp_path, target):
    from safetensors.torch import load_file, save_file
    from tiny import build_draft

    draft, contract = build_draft(target, taps=TRAINED)
    out = export_draft(draft, contract, tmp_path / "v", "vllm")
    t = load_file(str(out / "model.safetensors"))
    t["fc.weight"][0, 0] = float("nan")
    t["norm.weight"].zero_()
    t["lm_head.weight"] = target.model.lm_head.weight.detach()[torch.arange(0, 256, 2)].clone()
    save_file(t, str(out / "model.safetensors"))
    found = {(f.level, f.what) for f in run_checks(inspect_dir(out, "vllm"), target).findings if f.check == "weights"}
    assert ("error", "fc.weight holds 1 NaN/Inf value(s)") in found
    assert ("error", "norm.weight is all zeros") in found
    assert ("warn", "lm_head equals the target's lm_head rows bit for bit") in found


def test_import_with_a_target_prints_its_phases_while_it_measures(tmp_path, target, trained):
    """`eaglewire import --target` measures for minutes on a real target: a line per phase in a CI log."""
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    target.model.save_pretrained(tmp_path / "t")
    broken = _export(tmp_path, trained, "vllm", [0, 2, 4])
    r = CliRunner().invoke(
        app,
        [
            "import",
            str(broken),
            "--format",
            "vllm",
            "--target",
            str(tmp_path / "t"),
            "--out",
            str(tmp_path / "imported"),
        ],
    )
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.split("] ", 1)[-1].startswith("importing: no contract file")]
    assert len(lines) >= 4 and lines[0].endswith("started") and lines[-1].endswith("done"), r.stderr


def test_import_records_the_measured_taps_and_exports_carry_them(tmp_path, target, trained, bounds):
    """A foreign draft whose config gives the embedding tap: import with the target records the trained
    boundaries as an inferred contract; the native checkpoint and a re-export carry it, and the re-export's
    ids are the trained ones (the doctor then finds no error and says the contract was inferred)."""
    from functools import partial

    from eaglewire.compose import load_draft
    from eaglewire.doctor.measures import measured_taps
    from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint

    broken = _export(tmp_path, trained, "vllm", [0, 2, 4])
    measured = partial(measured_taps, bounds=bounds)
    draft = load_draft(broken, target, fmt="vllm", measure=measured)
    contract = draft.contract
    ev = contract.inferred
    assert contract.taps == TRAINED and ev["source"] == "measured" and ev["engine"] == "vllm"
    assert ev["best"] == list(TRAINED) and ev["delivered"] == [0, 2, 4]
    assert ev["error"] is True and ev["tokens"] > 0 and ev["target"] == target.name
    assert contract == trained[1] and contract.fingerprint() == trained[1].fingerprint()  # provenance only
    native = save_checkpoint(draft, contract, tmp_path / "native")
    again = load_checkpoint(native, target=target)
    assert again.contract.inferred == ev
    fixed = export_draft(again, again.contract, tmp_path / "fixed", "vllm")
    assert json.loads((fixed / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == list(TRAINED)
    report = run_checks(inspect_dir(fixed, "vllm"), target)
    assert report.errors == 0
    assert any(f.check == "contract" and "were inferred" in f.what for f in report.findings), report.findings

    c2 = load_draft(broken, target, fmt="vllm").contract  # the config's ids, as vLLM reads them
    assert c2.taps == (0, 2, 4) and c2.inferred == {"source": "engine_config", "engine": "vllm"}

    def never(*_args):
        raise AssertionError("a draft with its contract file is not measured")

    c3 = load_draft(fixed, target, measure=never).contract  # a contract file: imported as it is
    assert c3.inferred == ev
