"""The doctor on block drafters (DFlash family): every layout read and named, a clean export of each format passes
for each engine, and each broken variant the field reports gets its finding and a non-zero exit (--json stable).

The drafts here come from eaglewire's own writers (export/block.py) and, for the layouts whose tools need a GPU
(z-lab's and SpecForge's trainers, DeepSpec: flex attention / CUDA), from those writers' configs edited into the
other tool's layout field for field, as each tool's code writes it (cited per case). speculators' own writer
runs here: tests/export/test_real_clients.py drives it for the speculators layouts."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny import VOCAB, build_target

from eaglewire.doctor.block_checks import check_block
from eaglewire.doctor.block_inspect import block_layout, is_block_dir
from eaglewire.export.base import CONTRACT_FILE
from eaglewire.export.block import export_block_draft
from eaglewire.families import BlockWiring

L = 8
TAPS = (1, 3, 5, 7)
MASK = VOCAB - 1


@pytest.fixture(scope="module")
def target():
    return build_target("llama", layers=L)


@pytest.fixture(scope="module")
def drafted(target):
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract

    return build_dflash_draft(
        target, dflash_contract(target, TAPS, BlockWiring(block_size=4, mask_token_id=MASK)), 2, seed=3
    )


def _export(drafted, tmp_path, fmt, edit=None, contract=True):
    out = export_block_draft(drafted, drafted.contract, tmp_path / fmt, fmt)
    if edit is not None:
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    if not contract:
        (out / CONTRACT_FILE).unlink()
    return out


def _doctor(out, engine, target, version=None):
    return check_block(out, json.loads((out / "config.json").read_text()), engine, version, target)


def _codes(report, level="error"):
    return sorted({f.check for f in report.findings if f.level == level})


CLEAN = [("zlab", "vllm"), ("zlab", "sglang"), ("sglang", "vllm"), ("sglang", "sglang"), ("vllm", "vllm")]


@pytest.mark.parametrize("fmt,engine", CLEAN)
@pytest.mark.parametrize("contract", [True, False])
def test_clean_exports_pass_and_name_family_layout_and_rule(tmp_path, target, drafted, fmt, engine, contract):
    out = _export(drafted, tmp_path, fmt, contract=contract)
    report = _doctor(out, engine, target)
    assert report.errors == 0, report.to_json()
    layout = {"zlab": "zlab", "sglang": "sglang", "vllm": "speculators"}[fmt]
    assert (report.family, report.layout, report.engine) == ("dflash", layout, engine)
    read = next(f for f in report.findings if f.check == "block_read")
    assert f"{engine} {report.engine_version}" in read.what and str(list(TAPS)) in read.what
    assert report.engine_version == {"vllm": "0.32", "sglang": "0.5.23"}[engine]  # the newest row by default


def _shift_ids(cfg):
    at = cfg["dflash_config"] if "dflash_config" in cfg else cfg
    key = "target_layer_ids" if "dflash_config" in cfg else "aux_hidden_state_layer_ids"
    at[key] = [i + 1 for i in at[key]]


def _neox_off(cfg):
    (cfg.get("transformer_layer_config") or cfg)["is_neox_style"] = False


def _block(cfg):
    cfg["block_size"] = 8
    cfg.get("dflash_config", {}).pop("block_size", None)


def _mask(cfg):
    (cfg["dflash_config"] if "dflash_config" in cfg else cfg)["mask_token_id"] = 5


def _no_ids(cfg):
    (cfg["dflash_config"] if "dflash_config" in cfg else cfg).pop(
        "target_layer_ids" if "dflash_config" in cfg else "aux_hidden_state_layer_ids"
    )


def _eagle_aux(cfg):
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 4, 6, 7]  # a leftover of an EAGLE-3 config


# The broken DFlash exports the field reports (issue: ids shifted by one, an eagle_aux leftover, neox off, a wrong
# block size, a wrong mask token, missing ids), each in the formats vLLM serves, with the finding each must get.
BROKEN = [
    ("shifted", _shift_ids, "block_taps"),
    ("neox_off", _neox_off, "block_rope"),
    ("block_size", _block, "block_size"),
    ("mask", _mask, "block_mask_token"),
    ("no_ids", _no_ids, "block_ids_missing"),
]


@pytest.mark.parametrize("fmt", ["zlab", "vllm"])
@pytest.mark.parametrize("case,edit,code", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_export_gets_its_finding_on_vllm(tmp_path, target, drafted, fmt, case, edit, code):
    report = _doctor(_export(drafted, tmp_path, fmt, edit), "vllm", target)
    assert code in _codes(report), report.to_json()


def test_an_eagle_aux_leftover_overrides_the_dflash_ids_in_vllm_only(tmp_path, target, drafted):
    out = _export(drafted, tmp_path, "zlab", _eagle_aux)
    on_vllm = _doctor(out, "vllm", target)
    assert {"block_eagle_aux", "block_taps"} <= set(_codes(on_vllm)), on_vllm.to_json()
    assert on_vllm.layout == "vllm-edited"
    on_sglang = _doctor(out, "sglang", target)  # SGLang reads only the DFlash ids: a warning, not an error
    assert on_sglang.errors == 0 and "block_eagle_aux" in _codes(on_sglang, "warn")


def test_vllms_own_edit_of_a_zlab_config_is_clean(tmp_path, target, drafted):
    """What vLLM's update_dflash writes (eagle_aux = target_layer_ids + 1) agrees with itself: no finding."""

    def edit(cfg):
        cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]

    report = _doctor(_export(drafted, tmp_path, "zlab", edit, contract=False), "vllm", target)
    assert report.errors == 0 and report.layout == "vllm-edited", report.to_json()


def test_engine_versions_apply_their_own_rules(tmp_path, target, drafted):
    out = _export(drafted, tmp_path, "zlab")
    old = _doctor(out, "vllm", target, "0.21.0")  # before PR #40727, no +1: every tap one boundary early
    taps = next(f for f in old.findings if f.check == "block_taps")
    assert taps.level == "error" and "off by -1" in taps.what and old.engine_version == "0.21.0 (rules of 0.20)"
    assert "block_taps" in _codes(_doctor(out, "vllm", target, "before-pr40727"))  # the PR's name still works
    assert "block_taps" not in _codes(_doctor(out, "vllm", target, "0.22.0"))  # PR #40727's first release
    rope = _doctor(out, "vllm", target, "0.28.0")  # the target's RoPE layout (PR #51655, before PR #54373)
    assert rope.errors == 0 and "block_rope" in _codes(rope, "warn")
    neox_off = _export(drafted, tmp_path / "n", "zlab", _neox_off)
    assert "block_rope" not in _codes(_doctor(neox_off, "vllm", target, "0.28.0"))  # the flag is unread
    assert "block_rope" in _codes(_doctor(neox_off, "vllm", target, "0.30.0"))  # read from 0.29 (PR #54373)
    always = _doctor(neox_off, "vllm", target, "0.25.0")  # get_rope's neox whatever the flag says
    assert always.errors == 0 and "block_rope" in _codes(always, "warn")
    from eaglewire.errors import EaglewireError

    with pytest.raises(EaglewireError, match="not a version"):
        _doctor(out, "vllm", target, "0.1")


def test_sglang_guesses_missing_ids_and_a_count_collision_is_caught(tmp_path, target):
    """SGLang's guess takes as many ids as the draft has LAYERS (build_target_layer_ids, sglang #37475): with as
    many taps as layers it loads silently on the wrong layers."""
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract

    d = build_dflash_draft(target, dflash_contract(target, (2, 4), BlockWiring(4, MASK)), 2, seed=1)
    out = _export(d, tmp_path, "sglang", _no_ids)
    f = next(f for f in _doctor(out, "sglang", target).findings if f.check == "block_ids_missing")
    assert f.level == "error" and "count is right" in f.why and "[2, 6]" in f.what  # guess [1, 5], + 1
    d = build_dflash_draft(target, dflash_contract(target, (2, 6), BlockWiring(4, MASK)), 2, seed=1)
    f = next(
        f
        for f in _doctor(_export(d, tmp_path / "g", "sglang", _no_ids), "sglang", target).findings
        if f.check == "block_ids_missing"
    )
    assert f.level == "warn"  # the guess happens to be right


def test_a_speculators_config_on_sglang_has_no_ids(tmp_path, target, drafted):
    report = _doctor(_export(drafted, tmp_path, "vllm"), "sglang", target)
    assert _codes(report) == ["block_ids_missing"] and "--format sglang" in report.findings[0].fix


def test_sliding_layers_on_an_sglang_without_a_layer_types_reader(tmp_path, target, drafted):
    def edit(cfg):
        cfg["layer_types"] = ["sliding_attention", "full_attention"]

    out = _export(drafted, tmp_path, "sglang", edit)
    assert "block_attention" in _codes(_doctor(out, "sglang", target, "0.5.13"))
    assert "block_attention" not in _codes(_doctor(out, "sglang", target, "0.5.23"))


def test_speculators_causal_override_anchor_quantization(tmp_path, target, drafted):
    out = _export(drafted, tmp_path, "vllm", lambda c: c.update(sliding_window_non_causal=False))
    assert "block_attention" in _codes(_doctor(out, "vllm", target))
    out = _export(drafted, tmp_path / "a", "vllm", lambda c: c.update(sample_from_anchor=True))
    assert "block_anchor" in _codes(_doctor(out, "vllm", target))
    out = _export(drafted, tmp_path / "q", "zlab", lambda c: c.update(quantization_config={"quant_method": "fp8"}))
    assert "block_engine_path" in _codes(_doctor(out, "vllm", target), "warn")


def test_dspark_without_sample_from_anchor_runs_in_the_dflash_layout_on_vllm(tmp_path, target, drafted):
    def edit(cfg):
        cfg.update(speculators_model_type="dspark", architectures=["DSparkSpeculator"], markov_rank=8)
        cfg.pop("sample_from_anchor")

    report = _doctor(_export(drafted, tmp_path, "vllm", edit, contract=False), "vllm", target)
    assert report.family == "dspark" and "block_anchor" in _codes(report), report.to_json()


def test_dflash2_reduced_vocab_and_v2_runner(tmp_path, target, drafted):
    def edit(cfg):
        cfg.update(speculators_model_type="dflash2", architectures=["DFlash2Speculator"], draft_vocab_size=128)

    out = _export(drafted, tmp_path, "vllm", edit, contract=False)
    report = _doctor(out, "vllm", target)
    assert report.family == "dflash2" and "block_vocab" in _codes(report)
    assert "block_engine_path" in _codes(report, "warn")


@pytest.fixture(scope="module")
def reduced(target):
    import torch

    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.draft.vocab import VocabMap

    vmap = VocabMap.from_target_ids(torch.arange(0, VOCAB, 2), VOCAB)
    contract = dflash_contract(target, TAPS, BlockWiring(block_size=4, mask_token_id=MASK), vmap)
    return build_dflash_draft(target, contract, 1, seed=3, vmap=vmap)


def _weights(out, fn):
    t = load_file(out / "model.safetensors")
    fn(t)
    save_file(t, out / "model.safetensors")


def test_a_reduced_vocabulary_is_clean_on_vllm_and_its_vocab_map_faults_are_caught(tmp_path, target, reduced):
    """The vocab-map checks are EAGLE-3's own (vocab_checks.vocab_map_findings), on a block drafter with its own head:
    a clean vLLM export passes; SGLang (no head of its own: it skips lm_head and d2t) is an error; absolute ids,
    a lost d2t (vLLM's zeros: draft id i drafts target id i) and a head of other rows each get their finding."""
    out = _export(reduced, tmp_path, "vllm")
    assert _codes(_doctor(out, "vllm", target)) == []
    assert "block_vocab" in _codes(_doctor(out, "sglang", target))
    cases = [
        ("absolute", lambda t: t.update(d2t=t["d2t"] + __import__("torch").arange(len(t["d2t"]))), "d2t"),
        ("lost", lambda t: t.pop("d2t"), "d2t"),
        ("rows", lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:-2].contiguous()}), "draft_vocab_size"),
    ]
    for name, damage, code in cases:
        bad = _export(reduced, tmp_path / name, "vllm", contract=False)
        _weights(bad, damage)
        assert code in _codes(_doctor(bad, "vllm", target)), name


def test_deepspec_layout(tmp_path, target, drafted):
    """DeepSpec's Qwen3DSparkModel config (markov_rank 0: its 'dflash' recipes), ids at the top level, -1 for the
    embedding; its trainer needs CUDA, so the config is our z-lab export rewritten as DeepSpec's config.py writes it."""

    def edit(cfg):
        ids = cfg.pop("dflash_config")["target_layer_ids"]
        cfg.update(
            architectures=["Qwen3DSparkModel"],
            markov_rank=0,
            enable_confidence_head=False,
            target_layer_ids=[-1, *ids[1:]],
            mask_token_id=MASK,
        )

    out = _export(drafted, tmp_path, "zlab", edit, contract=False)
    assert block_layout(json.loads((out / "config.json").read_text())) == ("dflash", "deepspec")
    report = _doctor(out, "sglang", target)
    assert "block_engine_path" in _codes(report) and report.layout == "deepspec"
    last = _export(drafted, tmp_path / "last", "zlab", lambda c: (edit(c), c.update(target_layer_ids=[0, 2, 4, L - 1])))
    assert any(
        f.check == "block_engine_path" and "last layer" in f.what for f in _doctor(last, "vllm", target).findings
    )


def test_fc_width_disagreeing_with_the_ids(tmp_path, target, drafted):
    """speculators' z-lab converter drops a tap whose +1 is the verifier's last layer: fewer ids than fc reads."""
    out = _export(drafted, tmp_path, "vllm", lambda c: c.update(aux_hidden_state_layer_ids=[1, 3, 5]))
    f = next(f for f in _doctor(out, "vllm", target).findings if f.check == "block_taps")
    assert "fc.weight reads 4 taps" in f.what


def test_an_eagle3_directory_is_not_a_block_drafter(tmp_path, target):
    from tiny import build_draft

    from eaglewire.export.convert import export_draft

    draft, contract = build_draft(target, taps=(2, 4, 5), seed=7)
    assert is_block_dir(export_draft(draft, contract, tmp_path / "e", "vllm")) is None


@settings(max_examples=12, deadline=None)
@given(
    taps=st.lists(st.integers(1, L - 1), min_size=2, max_size=4, unique=True).map(sorted),
    fmt_engine=st.sampled_from(CLEAN),
    shift=st.sampled_from([-1, 1]),
)
def test_property_any_clean_export_passes_and_any_shift_is_caught(tmp_path_factory, target, taps, fmt_engine, shift):
    """The class, not the case: for any taps, each format on each engine it serves reads clean, and the same
    config with every id moved by one is an error naming the shift (contract side file as the reference)."""
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract

    fmt, engine = fmt_engine
    d = build_dflash_draft(target, dflash_contract(target, tuple(taps), BlockWiring(4, MASK)), 1, seed=0)
    base = tmp_path_factory.mktemp("p")
    assert _doctor(_export(d, base, fmt), engine, target).errors == 0

    def move(cfg):
        at = cfg["dflash_config"] if "dflash_config" in cfg else cfg
        key = "target_layer_ids" if "dflash_config" in cfg else "aux_hidden_state_layer_ids"
        at[key] = [i + shift for i in at[key]]

    report = _doctor(_export(d, base / "s", fmt, move), engine, target)
    found = [f for f in report.findings if f.level == "error" and f.check == "block_taps"]
    assert found and (
        f"off by {shift:+d}" in found[0].what or "outside" in found[0].why or "would capture" in found[0].what
    ), report.to_json()


def test_cli_exit_codes_and_stable_json(tmp_path, drafted):
    """`eaglewire doctor DIR --engine vllm --json` (the real-vLLM table's call): 0 and no error on a clean export,
    1 with the finding on a broken one; the JSON names family, layout and engine version, key for key."""
    from test_server import _tiny_target_dir
    from typer.testing import CliRunner

    from eaglewire.cli.app import app
    from eaglewire.target.loader import load_target

    tdir = _tiny_target_dir(tmp_path)
    t = load_target(str(tdir))
    from eaglewire.draft.dflash import build_dflash_draft
    from eaglewire.draft.dflash_contract import dflash_contract

    d = build_dflash_draft(t, dflash_contract(t, (1, 2, 3), BlockWiring(4, t.vocab_size - 1)), 1, seed=0)
    runner = CliRunner()
    for case, edit, code in [("clean", None, None), *BROKEN]:
        out = _export(d, tmp_path / case, "vllm", edit)
        r = runner.invoke(app, ["doctor", str(out), "--engine", "vllm", "--target", str(tdir), "--json"])
        got = json.loads(r.stdout)
        assert list(got) == [
            "directory",
            "engine",
            "engine_version",
            "family",
            "layout",
            "errors",
            "findings",
            "measurement",
        ]
        assert (got["family"], got["layout"], got["engine_version"]) == ("dflash", "speculators", "0.32")
        assert r.exit_code == (0 if code is None else 1), (case, r.stdout)
        assert code is None or code in {f["check"] for f in got["findings"] if f["level"] == "error"}
    r = runner.invoke(app, ["doctor", str(tmp_path / "clean" / "vllm"), "--engine", "vllm", "--target", str(tdir)])
    assert r.exit_code == 0 and "dflash draft, speculators layout" in r.stdout and "vllm 0.32" in r.stdout
    # `doctor expect` takes a DFlash export: our engine predicts per position with vLLM's k (= B - 1 here) and
    # names the block rule that read the export (issue 47's "doctor expect for DFlash")
    r = runner.invoke(
        app,
        [
            "doctor",
            "expect",
            "--draft",
            str(tmp_path / "clean" / "vllm"),
            "--target",
            str(tdir),
            "--num-speculative-tokens",
            "3",
            "--limit",
            "1",
            "--max-new-tokens",
            "8",
            "--measured-tau",
            "1.0",
            "--json",
        ],
    )
    got = json.loads(r.stdout)
    assert r.exit_code == 0 and len(got["per_position"]) == 3, r.stdout
    assert got["layer_id_rule"] == "vllm 0.32 (dflash draft, speculators layout)"


SPECULATORS_PY = __import__("os").environ.get("EAGLEWIRE_SPECULATORS_PYTHON")


@pytest.mark.skipif(
    not SPECULATORS_PY and __import__("os").environ.get("CI") != "true",  # CI: absence fails
    reason="set EAGLEWIRE_SPECULATORS_PYTHON (scripts/speculators_venv.sh)",
)
def test_speculators_own_writer_dflash_dspark_dflash2(tmp_path, target):
    """speculators' own config classes and models write the drafts (its trainer's checkpoint layout): the doctor
    names each family and layout, reads its HF-index taps, and finds what vLLM 0.32 would do to them: speculators'
    default sliding_window_non_causal false turns every DFlash layer causal in vLLM (update_dflash + causal
    override), DFlash2 needs the V2 runner; DSpark (sample_from_anchor true, written by speculators) is clean."""
    import subprocess
    from pathlib import Path

    assert SPECULATORS_PY, (
        "CI builds speculators' venv (scripts/speculators_venv.sh) and sets EAGLEWIRE_SPECULATORS_PYTHON"
    )
    target.model.save_pretrained(tmp_path / "target")
    script = Path(__file__).parents[1] / "clients" / "speculators_block_write.py"
    r = subprocess.run(
        [SPECULATORS_PY, str(script), str(tmp_path), str(tmp_path / "target"), "1,3,5,7", "4", str(MASK)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    found = {}
    for kind in ("dflash", "dspark", "dflash2"):
        out = tmp_path / kind
        report = _doctor(out, "vllm", target)
        read = next(f for f in report.findings if f.check == "block_read")
        assert (report.family, report.layout) == (kind, "speculators") and "[1, 3, 5, 7]" in read.what
        found[kind] = (_codes(report), _codes(report, "warn"))
    assert found["dflash"][0] == ["block_attention"]
    assert found["dspark"][0] == []
    assert found["dflash2"][0] == [] and "block_engine_path" in found["dflash2"][1]


def test_the_remaining_findings(tmp_path, target, drafted):
    """The rest of the catalogue: no target to resolve SGLang's model file or the layer count, ids outside the
    target, no block size, two block sizes, no mask token, a mask token outside the vocabulary."""
    bare = _export(drafted, tmp_path / "bare", "zlab", contract=False)
    assert "block_taps" in _codes(_doctor(bare, "sglang", None), "warn")  # which SGLang model file: unknown
    no_ids = _export(drafted, tmp_path / "no_ids", "zlab", _no_ids, contract=False)
    assert "block_ids_missing" in _codes(_doctor(no_ids, "vllm", None))
    far = _export(drafted, tmp_path / "far", "vllm", lambda c: c.update(aux_hidden_state_layer_ids=[1, 3, 5, 12]))
    assert any("would capture" in f.what for f in _doctor(far, "vllm", target).findings)
    no_block = _export(drafted, tmp_path / "nb", "zlab", lambda c: c.pop("block_size"))
    assert "block_size" in _codes(_doctor(no_block, "vllm", target), "warn")
    two = _export(drafted, tmp_path / "two", "sglang", lambda c: c.update(block_size=8))
    assert any("disagree" in f.what for f in _doctor(two, "sglang", target).findings if f.level == "error")
    no_mask = _export(drafted, tmp_path / "nm", "zlab", lambda c: c["dflash_config"].pop("mask_token_id"))
    assert "block_mask_token" in _codes(_doctor(no_mask, "vllm", target))
    big = _export(drafted, tmp_path / "big", "zlab", lambda c: c["dflash_config"].update(mask_token_id=VOCAB))
    assert any("not a row" in f.what for f in _doctor(big, "vllm", target).findings)


def test_import_reads_vllms_own_edit_and_refuses_other_families_by_name(tmp_path, target, drafted):
    """`eaglewire import`: a z-lab config as vLLM's updater leaves it (eagle_aux = target_layer_ids + 1, the same
    layers) imports as the z-lab layout; a DSpark / DFlash2 / DeepSpec draft is refused naming its family and
    pointing at the doctor, instead of failing inside the EAGLE-3 reader."""
    from eaglewire.errors import CheckpointError
    from eaglewire.export.convert import import_draft

    def vllm_edit(cfg):
        cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]

    back, contract = import_draft(_export(drafted, tmp_path, "zlab", vllm_edit, contract=False), "zlab", target=target)
    assert contract.taps == TAPS and back.block == drafted.block
    for name, edit in [
        ("dspark", lambda c: c.update(speculators_model_type="dspark", architectures=["DSparkSpeculator"])),
        ("dflash2", lambda c: c.update(speculators_model_type="dflash2", architectures=["DFlash2DraftModel"])),
    ]:
        out = _export(drafted, tmp_path / name, "vllm", edit, contract=False)
        with pytest.raises(CheckpointError, match=f"a {name} block drafter") as err:
            import_draft(out, "vllm", target=target)
        assert "eaglewire doctor" in err.value.fix


def test_peagle_mask_hidden_and_mask_token(tmp_path, target):
    """P-EAGLE (an EAGLE-3 draft with a mask token and a learned mask_hidden; no tool here writes one on a CPU,
    so our EAGLE-3 vLLM export is given speculators' peagle fields): the EAGLE-3 doctor's verdict plus the P-EAGLE
    finding, and nothing else on an EAGLE-3 export."""
    import torch
    from tiny import build_draft

    from eaglewire.doctor.checks import run_checks
    from eaglewire.doctor.inspect import inspect_dir
    from eaglewire.export.convert import export_draft

    draft, contract = build_draft(target, taps=(2, 4, 5), seed=7)
    plain = export_draft(draft, contract, tmp_path / "e3", "vllm")
    assert not any(f.check == "peagle" for f in run_checks(inspect_dir(plain, "vllm"), target).findings)

    def peagle(name, mask_hidden, **fields):
        out = export_draft(draft, contract, tmp_path / name, "vllm")
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(speculators_model_type="peagle", architectures=["PEagleSpeculator"], **fields)
        (out / "config.json").write_text(json.dumps(cfg))
        if mask_hidden is not None:
            save_file({**load_file(out / "model.safetensors"), "mask_hidden": mask_hidden}, out / "model.safetensors")
        return [(f.level, f.what) for f in run_checks(inspect_dir(out, "vllm"), target).findings if f.check == "peagle"]

    H = target.hidden_size
    good = peagle("good", torch.randn(1, 3 * H), mask_token_id=5)
    assert [lvl for lvl, _ in good] == ["info"]
    assert any("without its mask_hidden" in w for _, w in peagle("none", None, mask_token_id=5))
    assert any("not 3 taps" in w for _, w in peagle("shape", torch.zeros(1, H), mask_token_id=5))
    assert any("without mask_token_id" in w for _, w in peagle("nomask", torch.zeros(1, 3 * H)))


def test_engine_knobs_against_the_trained_block(tmp_path, target, drafted):
    """vLLM's k (num_speculative_tokens) or SGLang's num_draft_tokens against the block of 4 (3 drafts)."""
    from eaglewire.decoding.tree import TreeShape

    out = _export(drafted, tmp_path, "vllm")
    cfg = json.loads((out / "config.json").read_text())
    over = check_block(out, cfg, "vllm", None, target, TreeShape.chain(5))
    assert "block_knobs" in _codes(over) and "--num-speculative-tokens 3" in over.findings[0].fix
    assert "block_knobs" in _codes(check_block(out, cfg, "vllm", None, target, TreeShape.chain(2)), "info")
    assert check_block(out, cfg, "vllm", None, target, TreeShape.chain(3)).errors == 0
    sg = _export(drafted, tmp_path / "s", "sglang")
    f = check_block(
        sg, json.loads((sg / "config.json").read_text()), "sglang", None, target, TreeShape.from_knobs(7, 1, 8, None)
    )
    assert "block_knobs" in _codes(f) and "--speculative-num-draft-tokens 4" in f.findings[0].fix


def test_a_native_dflash_checkpoint_is_checked_as_its_export(tmp_path, target, drafted):
    """`doctor CKPT --engine vllm|sglang` on our own DFlash checkpoint checks the export that engine gets (not the
    EAGLE-3 reading of it); without --engine it is refused as an EAGLE-3 checkpoint is."""
    from eaglewire.errors import EaglewireError
    from eaglewire.export.checkpoint import save_checkpoint

    ckpt = save_checkpoint(drafted, drafted.contract, tmp_path / "native")
    config = json.loads((ckpt / "config.json").read_text())
    assert is_block_dir(ckpt) is not None
    for engine in ("vllm", "sglang"):
        report = check_block(ckpt, config, engine, None, target)
        assert report.errors == 0 and report.layout == f"native (as exported for {engine})", report.to_json()
        assert report.directory == str(ckpt)
    with pytest.raises(EaglewireError, match="native"):
        check_block(ckpt, config, None, None, target)
