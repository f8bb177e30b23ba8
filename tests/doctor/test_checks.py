"""Doctor: healthy exports of every format raise no error; each broken fixture gets the right error."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import build_draft, build_target

from eaglewire.norms import NormFlags
from eaglewire.doctor.checks import run_checks
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.export.convert import export_draft


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=8)


@pytest.fixture(scope="module")
def drafted(target):
    return build_draft(target, taps=(2, 4, 5), seed=7)


def _doctor(path, target, engine=None):
    return run_checks(inspect_dir(path, engine), target)


def _errors(report):
    return [f for f in report.findings if f.level == "error"]


@pytest.mark.parametrize("fmt", ["sglang", "sglang-legacy", "vllm", "eagle", "specforge"])
def test_healthy_exports_have_no_error(tmp_path, target, drafted, fmt):
    draft, contract = drafted
    out = export_draft(draft, contract, tmp_path / fmt, fmt)
    report = _doctor(out, target, fmt)
    assert _errors(report) == [], report.to_json()


@pytest.mark.parametrize("preset", ["eagle3.1", "speculators"])
@pytest.mark.parametrize("fmt", ["sglang", "sglang-legacy", "vllm", "eagle", "specforge"])
def test_each_norm_set_exports_cleanly_where_served_and_is_refused_elsewhere(tmp_path, target, fmt, preset):
    """A draft trained with a norm set (eagle3.1: the default of a new draft) exports with no doctor error to
    every engine that serves the set, and is refused, naming the engines that do, by every other."""
    from eaglewire.norms import NORM_PRESETS
    from eaglewire.errors import CheckpointError
    from eaglewire.export.engines import ENGINES

    norm = NORM_PRESETS[preset]
    draft, contract = build_draft(target, taps=(2, 4, 5), seed=7, norm=norm)
    if norm.on <= ENGINES[fmt].norms:
        out = export_draft(draft, contract, tmp_path / fmt, fmt)
        assert _errors(_doctor(out, target, fmt)) == []
    else:
        with pytest.raises(CheckpointError, match="does not implement") as err:
            export_draft(draft, contract, tmp_path / fmt, fmt)
        assert "serve it on " in err.value.fix and "vllm" in err.value.fix


def _export(tmp_path, drafted, fmt="sglang"):
    draft, contract = drafted
    return export_draft(draft, contract, tmp_path / fmt, fmt)


def _edit_config(out, fn):
    cfg = json.loads((out / "config.json").read_text())
    fn(cfg)
    (out / "config.json").write_text(json.dumps(cfg))


def _edit_weights(out, fn):
    save_file(fn(load_file(str(out / "model.safetensors"))), str(out / "model.safetensors"))


def _expect(report, check, fragment):
    hits = [f for f in _errors(report) if f.check == check and fragment in f.what]
    assert hits, f"no {check} error containing {fragment!r}: {report.to_json()}"


def test_speculators_names_served_by_sglang(tmp_path, target, drafted):
    out = _export(tmp_path, drafted, "vllm")
    _expect(_doctor(out, target, "sglang"), "key_naming", "named for another engine")


def test_missing_lm_head_and_tied_embeddings(tmp_path, target, drafted):
    out = _export(tmp_path, drafted)
    _edit_weights(out, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    _edit_config(out, lambda c: c.update(tie_word_embeddings=True))
    report = _doctor(out, target)
    _expect(report, "lm_head", "missing")
    _expect(report, "tie_word_embeddings", "tie_word_embeddings")


def test_eagle_embedding_would_stay_random(tmp_path, target, drafted):
    out = _export(tmp_path, drafted, "eagle")
    _edit_config(out, lambda c: c.update(target_hidden_size=64))
    _expect(_doctor(out, target, "eagle"), "embed_tokens", "missing")


@pytest.mark.parametrize(
    "damage,check,fragment",
    [
        (lambda t: {k: v for k, v in t.items() if k != "d2t"}, "d2t", "missing"),
        (lambda t: {**t, "d2t": torch.arange(128) * 2 + 1}, "d2t", "ABSOLUTE"),  # absolute ids, not offsets
        (lambda t: {**t, "t2d": torch.ones(256, dtype=torch.bool)}, "t2d", "t2d.sum()"),
    ],
)
def test_vocab_map_failures(tmp_path, target, drafted, damage, check, fragment):
    out = _export(tmp_path, drafted)
    _edit_weights(out, damage)
    _expect(_doctor(out, target), check, fragment)


def test_draft_vocab_larger_than_target(tmp_path, target, drafted):
    out = _export(tmp_path, drafted)
    _edit_config(out, lambda c: c.update(draft_vocab_size=1000))
    _expect(_doctor(out, target), "draft_vocab_size", "> target vocab")


def test_single_state_fed_to_a_three_tap_draft(tmp_path, target, drafted):
    """Real case (a): the engine delivers one hidden state while fc expects three taps."""
    out = _export(tmp_path, drafted)
    _edit_config(out, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[4]))
    report = _doctor(out, target)
    _expect(report, "layer_ids", "1 layer ids but fc reads 3 taps")


def test_fc_width_that_would_be_skipped(tmp_path, target):
    draft, contract = build_draft(target, taps=(5,))  # one tap of width H: fc input == draft hidden size
    out = export_draft(draft, contract, tmp_path / "v", "vllm")
    _expect(_doctor(out, target, "vllm"), "fc", "as wide as the draft hidden size")


def test_embedding_tap_delivered_to_draft_trained_on_later_layers(tmp_path, target, drafted):
    """Real case (b): [embed, l2, l4]-style ids delivered to a draft trained on [2, 4, 5]."""
    out = _export(tmp_path, drafted, "vllm")
    _edit_config(out, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 2, 4]))
    _expect(
        _doctor(out, target, "vllm"),
        "layer_ids",
        "will deliver boundaries [0, 2, 4]; the draft was trained on [2, 4, 5]",
    )


def test_layer_ids_in_the_other_engines_convention(tmp_path, target, drafted):
    """vLLM's ids [2, 4, 5] in an SGLang export of a Llama target: llama.py adds 1 in every SGLang release."""
    out = _export(tmp_path, drafted, "sglang")
    _edit_config(out, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 4, 5]))  # vLLM's
    for engine in ("sglang-legacy", "sglang"):
        _expect(_doctor(out, target, engine), "layer_ids", "right ids in the")
        error = _errors(_doctor(out, target, engine))[0]
        assert (
            "vllm" in error.what and "llama.py (sglang-plus1)" in error.what and "--arch LlamaForCausalLM" in error.fix
        )


def test_layer_ids_of_a_deepseek_target_depend_on_the_sglang_release(tmp_path):
    """The seeds' case, on a DeepSeek-V3 target: deepseek_v2.py reads ids [2, 4, 5] raw since 0.5.13 (PR
    #25454) and shifted before it; the doctor names the file and the release of each reading."""
    target = build_target("deepseek_v3", layers=8)
    draft, contract = build_draft(target, taps=(2, 4, 5), seed=7)
    out = export_draft(draft, contract, tmp_path / "s", "sglang")
    assert json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
        1,
        3,
        4,
    ]
    _edit_config(out, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 4, 5]))
    report = _doctor(out, target, "sglang")
    assert not _errors(report)
    warn = next(f for f in report.findings if f.level == "warn" and f.check == "layer_ids")
    assert "0.5.23 deepseek_v2.py (sglang-first1)" in warn.what and "0.5.12.post1 deepseek_v2.py" in warn.what
    error = _errors(_doctor(out, target, "sglang-legacy"))[0]
    assert "(SGLang 0.5.12.post1 deepseek_v2.py (sglang-plus1)) will deliver boundaries [3, 5, 6]" in error.what


@pytest.mark.parametrize(
    "edit,fragment",
    [
        (lambda c: c.pop("eagle_config"), "no layer ids"),
        (
            lambda c: c.update(
                eagle_aux_hidden_state_layer_ids=c.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
            ),
            "is present but not read",
        ),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[3, 1, 4]), "not ascending"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 3]), "duplicated"),
        (lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 7]), "cannot be captured"),
    ],
)
def test_layer_id_failures(tmp_path, target, edit, fragment):
    off_default = build_draft(target, taps=(3, 4, 6), seed=7)  # a missing list falls back to [2, 4, 5]: wrong
    out = _export(tmp_path, off_default, "sglang")
    _edit_config(out, edit)
    _expect(_doctor(out, target, "sglang"), "layer_ids", fragment)


def test_norm_flags_the_engine_ignores(tmp_path, target):
    draft, contract = build_draft(target, taps=(2, 4, 5), norm=NormFlags(norm_before_fc=True))
    out = export_draft(draft, contract, tmp_path / "v", "vllm")
    _expect(_doctor(out, target, "sglang"), "norm_flags", "norm_before_fc")
    _edit_config(out, lambda c: c.pop("norm_before_residual"))
    _expect(_doctor(out, target, "vllm"), "norm_flags", "norm_before_residual is absent")


def test_sglang_norm_output_read_by_specforge(tmp_path, target, drafted):
    """SGLang's norm_output: false ('feed the pre-norm state back') is 'no final norm' to SpecForge."""
    out = _export(tmp_path, drafted)  # an SGLang export
    _expect(_doctor(out, target, "specforge"), "norm_flags", "norm_output: false")
    assert not _errors(_doctor(out, target, "sglang"))


def test_specforge_ids_that_depend_on_its_capture_backend(tmp_path, target):
    """SpecForge's HF hooks read id k as the output of layer k; through SGLang the target's model file decides:
    llama.py adds 1 too (the readings agree), deepseek_v2.py does not when the first id is not 1."""
    draft, contract = build_draft(target, taps=(3, 5, 6))  # first tap not boundary 2
    rep = _doctor(export_draft(draft, contract, tmp_path / "sf", "specforge"), target, "specforge")
    assert not _errors(rep) and not any(f.check == "layer_ids" for f in rep.findings)
    deepseek = build_target("deepseek_v3", layers=8)
    draft, contract = build_draft(deepseek, taps=(3, 5, 6))
    rep = _doctor(export_draft(draft, contract, tmp_path / "ds", "specforge"), deepseek, "specforge")
    assert not _errors(rep)
    assert any(
        f.check == "layer_ids" and "through SGLang" in f.what and "deepseek_v2.py" in f.what for f in rep.findings
    )


def test_other_target_and_chat_template(tmp_path, drafted, target):
    out = _export(tmp_path, drafted)
    other = build_target("qwen2", layers=8)
    _expect(_doctor(out, other), "target", "trained for")
    target.tokenizer = type("T", (), {"chat_template": "{{ messages }}"})()
    try:
        contract_file = out / "eaglewire_contract.json"
        c = json.loads(contract_file.read_text())
        c["chat_template_sha256"] = "0" * 64
        contract_file.write_text(json.dumps(c))
        _expect(_doctor(out, target), "chat_template", "chat template differs")
    finally:
        target.tokenizer = None


def test_rope_and_positions_warn(tmp_path, target, drafted):
    out = _export(tmp_path, drafted)
    _edit_config(out, lambda c: c.update(rope_theta=1.0, max_position_embeddings=16, rope_scaling={"type": "linear"}))
    checks = {f.check for f in _doctor(out, target).findings if f.level == "warn"}
    assert {"rope", "max_positions"} <= checks


def test_doctor_cli_exit_codes(tmp_path, drafted):
    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    draft, contract = drafted
    # the CLI loads the target by path: save the tiny 8-layer target to disk
    t = build_target("llama", layers=8)
    t.model.save_pretrained(tmp_path / "target")
    out = _export(tmp_path, drafted)
    r = CliRunner().invoke(app, ["doctor", str(out), "--target", str(tmp_path / "target"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["errors"] == 0
    _edit_weights(out, lambda t: {k: v for k, v in t.items() if k != "d2t"})
    r = CliRunner().invoke(app, ["doctor", str(out), "--target", str(tmp_path / "target")])
    assert r.exit_code == 1 and "ERROR" in r.output


def test_parts_still_at_a_known_init_are_named():
    """PyTorch's Linear default and HF's N(0, 0.02) are recognised; the released draft's trained weights,
    and a matrix trained a little away from either, are not."""
    from safetensors import safe_open

    from eaglewire.export.checkpoint import released_draft_dir
    from eaglewire.doctor.weights import at_init

    torch.manual_seed(0)
    fresh = torch.nn.Linear(1728, 576).weight.detach()
    assert "PyTorch's Linear default" in at_init("fc.weight", fresh)
    assert "initializer_range" in at_init("layers.0.mlp.up_proj.weight", torch.randn(1536, 576) * 0.02)
    assert "exactly 1.0" in at_init("norm.weight", torch.ones(576))
    assert at_init("norm.weight", torch.ones(576) + 1e-3) is None
    assert at_init("fc.weight", fresh + 0.01 * torch.randn_like(fresh)) is None  # moved off U: tails and kurtosis
    assert at_init("fc.weight", torch.randn(576, 1728) * 0.021) is None  # 5% off 0.02
    with safe_open(str(released_draft_dir() / "model.safetensors"), framework="pt") as f:
        flagged = {k: at_init(k, f.get_tensor(k)) for k in f.keys() if f.get_tensor(k).is_floating_point()}
    assert {k: v for k, v in flagged.items() if v} == {}


def test_never_trained_layer_and_float16_overflow_in_an_export(tmp_path, target, drafted):
    out = _export(tmp_path, drafted, "vllm")

    def damage(t):
        t["layers.0.mlp.up_proj.weight"] = torch.randn_like(t["layers.0.mlp.up_proj.weight"]).mul(0.02)
        t["lm_head.weight"][0, 0] = 1e5
        return t

    _edit_weights(out, damage)
    found = {(f.level, f.check, f.what.split(":")[0]) for f in _doctor(out, target, "vllm").findings}
    assert ("warn", "weights", "layers.0.mlp.up_proj.weight looks never trained") in found  # 128 x 64
    assert ("warn", "dtype", "lm_head.weight holds |w| up to 1e+05, beyond float16's 65504") in found


def test_zero_embedding_as_speculators_resaves_it(tmp_path, target, drafted):
    """speculators 0.9.0's save_pretrained of a draft without its embedding writes embed_tokens of zeros
    (tests/vllm_client/test_vllm_client.py); vLLM would use them."""
    out = _export(tmp_path, drafted, "vllm")

    def zero_embedding(t):
        t["embed_tokens.weight"] = torch.zeros(target.vocab_size, target.hidden_size)
        return t

    _edit_weights(out, zero_embedding)
    errs = [f for f in _errors(_doctor(out, target, "vllm")) if f.check == "weights"]
    assert any(f.what == "embed_tokens.weight is all zeros" and "speculators" in f.why for f in errs), errs


def test_config_norm_flags_against_training_and_missing_draft_vocab_size(tmp_path, target, drafted):
    """Reproduced in real vLLM (benchmarks/results/doctor/): norm_before_residual: true on a draft trained
    without it ran silently at tau 1.11 (healthy 1.45); draft_vocab_size missing was refused by vLLM."""
    out = _export(tmp_path, drafted, "vllm")
    _edit_config(out, lambda c: c.update(norm_before_residual=True))
    _expect(_doctor(out, target, "vllm"), "norm_flags", "config.json says norm_before_residual: True")
    out = _export(tmp_path / "b", drafted, "vllm")
    _edit_config(out, lambda c: c.pop("draft_vocab_size"))
    _expect(_doctor(out, target, "vllm"), "draft_vocab_size", "draft_vocab_size is missing")


def test_geometry_alone_refuses_a_foreign_draft_against_the_default(tmp_path, target, drafted):
    """Without --target, a draft whose config or contract names another model is refused before any
    finding about the wrong model is made; with --target (or a dump) the same call passes."""
    from eaglewire.doctor.geometry import require_default_target_fits, stated_by
    from eaglewire.errors import EaglewireError

    out = _export(tmp_path, drafted)
    hidden, contract = stated_by(out)
    assert hidden == target.hidden_size and contract is not None
    require_default_target_fits(hidden, contract, target, target_given=False, draft=str(out))  # its own target
    other = build_target("qwen2", layers=6)
    with pytest.raises(EaglewireError) as err:
        require_default_target_fits(hidden, contract, other, target_given=False, draft=str(out))
    assert "pass --target" in err.value.fix and "tiny-llama" in str(err.value)
    require_default_target_fits(hidden, contract, other, target_given=True, draft=str(out))
    (out / "eaglewire_contract.json").unlink()  # no contract: the config's hidden size is the evidence
    _edit_config(out, lambda c: c.update(hidden_size=4096, target_hidden_size=4096))
    with pytest.raises(EaglewireError, match="hidden states 4096 wide"):
        require_default_target_fits(*stated_by(out), target, target_given=False, draft=str(out))


@pytest.fixture(scope="module")
def default_target():
    from eaglewire.target.loader import load_target

    return load_target(None)  # the embedded target every doctor command loads without --target


def test_doctor_commands_refuse_the_default_target_for_a_foreign_draft(tmp_path, drafted, default_target, monkeypatch):
    """`doctor`, `doctor expect` and `doctor probe` without --target, given a draft for a 64-wide target:
    each exits 2 (a refused input) naming --target as the fix, instead of reporting the default target's mismatches."""
    from typer.testing import CliRunner

    import eaglewire.cli.doctor as cli_doctor
    from eaglewire.cli.app import app

    real = cli_doctor.load_target
    monkeypatch.setattr(
        cli_doctor, "load_target", lambda t, *a, **kw: default_target if t is None else real(t, *a, **kw)
    )
    out = _export(tmp_path, drafted)
    dump = tmp_path / "dump.safetensors"
    save_file({"hidden": torch.zeros(4, 3 * 64), "input_ids": torch.arange(4)}, str(dump))
    for args in (
        ["doctor", str(out)],
        ["doctor", "expect", "--draft", str(out)],
        ["doctor", "probe", "--dump", str(dump), "--contract", str(out)],
    ):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        text = " ".join(str(r.exception).split()) + " ".join(r.output.split())
        assert "no --target was given" in text and "pass --target" in text, (args, text)
        assert "train for this target" not in text


def _with(out, key, fn):
    """The export with weight `key` replaced by fn(its tensor)."""
    _edit_weights(out, lambda t: {**t, key: fn(t[key])})


def test_wrong_shapes_dtypes_and_a_target_of_another_width(tmp_path, target, drafted):
    out = _export(tmp_path, drafted)
    _edit_weights(out, lambda t: {**t, "embed_tokens.weight": torch.zeros(10, 64)})
    _expect(_doctor(out, target), "embed_tokens", "embed_tokens has shape (10, 64)")
    out = _export(tmp_path / "fc", drafted)
    _with(out, "fc.weight", lambda w: w[:, :100].contiguous())
    _expect(_doctor(out, target), "fc", "fc reads 100 channels")
    out = _export(tmp_path / "h", drafted)
    _edit_config(out, lambda c: c.update(hidden_size=32))
    _expect(_doctor(out, target), "target", "draft hidden size 32 != target 64")
    out = _export(tmp_path / "dt", drafted)
    _with(out, "fc.weight", lambda w: w.to(torch.float16))
    assert any(f.check == "dtype" and "mixed weight dtypes" in f.what for f in _doctor(out, target).findings)


def test_safeailab_eagle_taps_only_the_defaults(tmp_path, target, drafted):
    """eaglewire refuses that export; a contract edited (or a draft renamed) after it is still caught."""
    out = _export(tmp_path, drafted, "eagle")
    contract_file = out / "eaglewire_contract.json"
    contract_file.write_text(json.dumps({**json.loads(contract_file.read_text()), "taps": [1, 3, 6]}))
    _expect(_doctor(out, target, "eagle"), "layer_ids", "SafeAILab EAGLE taps boundaries [2, 4, 5]")


def test_vocab_maps_out_of_order_or_disagreeing(tmp_path, target, drafted):
    out = _export(tmp_path, drafted)
    ids = torch.arange(0, 256, 2)
    swapped = ids.clone()
    swapped[[3, 4]] = ids[[4, 3]]
    _with(out, "d2t", lambda d: (swapped - torch.arange(len(ids))).to(d.dtype))
    assert any(f.check == "d2t" and "not in ascending" in f.what for f in _doctor(out, target).findings)
    out = _export(tmp_path / "t2d", drafted)

    def flip(t2d):
        t2d = t2d.clone()
        t2d[0], t2d[1] = False, True  # same count, another member
        return t2d

    _with(out, "t2d", flip)
    _expect(_doctor(out, target), "t2d", "d2t and t2d disagree")


def test_speculators_norm_flag_only_at_the_top_level(tmp_path, target):
    from eaglewire.norms import NORM_PRESETS

    out = _export(tmp_path, build_draft(target, taps=(2, 4, 5), seed=7, norm=NORM_PRESETS["eagle3.1"]), "vllm")
    _edit_config(out, lambda c: c["transformer_layer_config"].pop("fc_norm", None))
    assert any(
        f.check == "norm_flags" and "fc_norm is only at the top level" in f.what
        for f in _doctor(out, target, "vllm").findings
    )


def test_the_wiring_is_not_measured_where_it_cannot_be(tmp_path, target, drafted):
    """The measurement's own refusals: fc not whole target states, no candidate of the draft's width, a draft
    that does not load. Each is said, not skipped silently (and none needs the target run)."""
    from eaglewire.doctor.measured_wiring import run_measurement

    def measured(out, engine="vllm"):
        return run_measurement(inspect_dir(out, engine), target)[1][0]

    out = _export(tmp_path, drafted, "vllm")
    _with(out, "fc.weight", lambda w: w[:, :100].contiguous())
    assert "fc does not read whole target states" in measured(out).what
    out = _export(tmp_path / "two", build_draft(target, taps=(2, 5), seed=7), "vllm")
    _edit_config(out, lambda c: (c.get("eagle_config") or c).pop("eagle_aux_hidden_state_layer_ids"))
    assert "no 2-tap candidate" in measured(out).what
    out = _export(tmp_path / "nohead", drafted, "vllm")
    _edit_weights(out, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    f = measured(out)
    assert f.level == "warn" and "the draft does not load" in f.what
