"""`eaglewire run` end to end on a tiny in-test target (every stage, report, resume), the run config
schema, the report rendered by a real headless Chromium, and one short run on the real embedded target."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.errors import EaglewireError
from eaglewire.pipeline import runner, stages
from eaglewire.pipeline.budgets import BUDGETS
from eaglewire.pipeline.config import RunConfig, resolve
from eaglewire.target.loader import resolve_target

CONVS = [
    {
        "id": f"c{i}",
        "messages": [
            {"role": "user", "content": f"Count from {i} to {i + 5}."},
            {"role": "assistant", "content": "ok"},
        ],
    }
    for i in range(24)
]
QUESTIONS = [{"question_id": i, "category": "x", "turns": [f"Say {i} twice.", "Again."]} for i in range(3)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with the real SmolLM2 tokenizer and chat template, plus data and questions."""
    d = tmp_path_factory.mktemp("tiny_run_target")
    tok = AutoTokenizer.from_pretrained(resolve_target(None)[1])
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    (d / "convs.jsonl").write_text("\n".join(json.dumps(c) for c in CONVS))
    (d / "questions.jsonl").write_text("\n".join(json.dumps(q) for q in QUESTIONS))
    return d


def tiny_config(tiny: Path, **over) -> dict:
    base = {
        "target": str(tiny / "model"),
        # engine local: these tests are about the pipeline; tests/vllm_client/test_vllm_client.py covers vLLM
        "data": {
            "source": str(tiny / "convs.jsonl"),
            "conversations": 16,
            "max_new_tokens": 8,
            "max_turns": 1,
            "batch_size": 8,
            "max_length": 64,
            "engine": "local",
        },
        "vocab": {"draft_vocab_size": 200},
        "train": {
            "max_steps": 4,
            "batch_size": 4,
            "ttt_steps": 2,
            "warmup_steps": 1,
            "eval_every": 2,
            "ckpt_every": 2,
            "heldout_fraction": 0.2,
        },
        "bench": {
            "source": str(tiny / "questions.jsonl"),
            "prompts": 2,
            "max_new_tokens": 8,
            "chain_k": 2,
            "num_steps": 2,
            "topk": 2,
            "num_draft_tokens": 4,
        },
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return base


def run_cli(cfg: dict, out: Path, tmp: Path, name: str = "run.yaml"):
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return CliRunner().invoke(app, ["run", "--out", str(out), "--config", str(path), "--budget", "quick"])


def _state(out: Path) -> dict:
    return runner.RunState(out).records()


# --------------------------------------------------------------------------------------------- config


def test_every_budget_resolves_to_a_valid_config():
    for name in BUDGETS:
        cfg = resolve(name)
        assert cfg.bench.tree().num_draft_tokens == cfg.bench.num_draft_tokens
    assert resolve("quick").train.max_steps != RunConfig().train.max_steps  # the preset really applies


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"train": {"max_stepz": 3}}, "train.max_stepz"),
        ({"train": {"max_steps": "three"}}, "train.max_steps"),
        ({"data": {"conversations": 1.5}}, "data.conversations"),
        ({"formats": ["sglang", "tensorrt"]}, "formats"),
        ({"bench": {"num_steps": 1, "topk": 1, "num_draft_tokens": 5}}, "bench"),
        ({"bench": {"methods": ["vanilla", "beam"]}}, "bench.methods"),
        ({"bench": {"methods": ["eagle_chain"]}}, "including vanilla"),
        ({"bench": {"methods": ["vanilla", "prompt_lookup"]}}, "no draft row"),
        ({"train": {"capture_dtype": "fp16"}}, "train.capture_dtype"),
    ],
)
def test_config_refuses_unknown_keys_and_wrong_types_naming_the_field(tmp_path, bad, field):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(EaglewireError) as err:
        resolve("quick", path)
    assert field in str(err.value)


def test_the_capture_dtype_names_the_features_directory_as_resolved_on_this_machine(tiny):
    """ "auto" is bf16 on one machine and fp32 on another: the features stage's key holds the resolved dtype,
    so a run moved to another machine never resumes into shards of the other dtype."""
    from eaglewire.hw import native_bf16
    from eaglewire.target.loader import load_target

    target = load_target(str(tiny / "model"))
    keys = {
        d: runner.stage_keys(RunConfig(**tiny_config(tiny, train={"capture_dtype": d})), target, (2, 4, 5))
        for d in ("auto", "float32")
    }
    assert (keys["auto"]["features"] == keys["float32"]["features"]) == (not native_bf16())
    assert keys["auto"]["vocab"] == keys["float32"]["vocab"]  # the vocabulary does not depend on it


def test_vllm_regenerates_with_its_own_pool_width_and_throughput_knobs_name_no_directory(tiny, monkeypatch):
    """vLLM keeps data.engine_in_flight conversations in flight (HF generate's batch_size is another knob);
    neither changes the text, so neither is in the regenerate stage's key: a resume may change them."""
    import contextlib

    from eaglewire.vllm_client import server as vllm_client
    from eaglewire.data import regenerate as regen_mod
    from eaglewire.target.loader import load_target

    target = load_target(str(tiny / "model"))
    keys = [
        runner.stage_keys(RunConfig(**tiny_config(tiny, data=d)), target, (2, 4, 5))["regenerate"]
        for d in ({"engine_in_flight": 8, "batch_size": 4}, {"engine_in_flight": 64, "batch_size": 16})
    ]
    assert keys[0] == keys[1]
    seen = {}

    @contextlib.contextmanager
    def fake_server(tgt, s, dtype):
        seen["server"] = (s.batch_size, dtype)
        yield "generator"

    def fake_regen(source, out, gen, s, limit, on_batch):
        seen["pool"] = (gen, s.batch_size)
        return "stats"

    monkeypatch.setattr(vllm_client, "vllm_regenerator", fake_server)
    monkeypatch.setattr(regen_mod, "regenerate", fake_regen)
    cfg = RunConfig(**tiny_config(tiny, data={"engine_in_flight": 48, "batch_size": 4}))
    ctx = stages.Ctx(cfg=cfg, out=tiny, target=target, contract=target.contract((2, 4, 5)))
    assert stages._regen_vllm(ctx, tiny / "x.jsonl.gz", cfg.data.generation(), None) == "stats"
    assert seen == {"server": (48, "bfloat16"), "pool": ("generator", 48)}


def test_config_file_overrides_budget_and_flags_override_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"target": "/x", "train": {"lr": "1e-4"}}))
    cfg = resolve("quick", path, target="/y")
    assert cfg.train.lr == 1e-4 and cfg.target == "/y"
    assert cfg.train.max_steps == BUDGETS["quick"]["train"]["max_steps"]


# -------------------------------------------------------------------------------------------- pipeline


@pytest.fixture(scope="module")
def finished_run(tiny, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    out = tmp / "out"
    r = run_cli(tiny_config(tiny), out, tmp)
    assert r.exit_code == 0, r.output + repr(r.exception)
    return out, r.output


def test_run_writes_report_summary_exports_and_a_clean_doctor(finished_run):
    out, output = finished_run
    s = json.loads((out / "summary.json").read_text())
    assert s["taps"] == [2, 4, 5] and s["engine_ids"] == {"sglang": [1, 3, 4], "vllm": [2, 4, 5]}
    assert "decoder layers 1, 3 and 4" in s["wiring"]
    assert s["doctor_errors"] == {"sglang": 0, "vllm": 0}
    assert set(s["bench"]) == set(BUDGETS["quick"]["bench"]["methods"])  # quick's rows: no HF-generate ones
    # where the draft started and what training changed, on the bench's first prompts (both of them here)
    t = s["tau_before_after"]
    assert t["start"] == "a fresh draft (seed 0)" and not t["released"]  # no released draft for this target
    assert t["prompts"] == 2 and t["chain_k"] == 2 and 1 <= t["before"] <= 3 and 1 <= t["after"] <= 3
    assert f"τ (bench) {t['before']:.2f} before -> {t['after']:.2f} after" in s["verdict"]
    assert all(m["matches_vanilla"] == 2 for m in s["bench"].values())  # lossless on every prompt
    from eaglewire.hw import runtime_dtype  # the features were captured in the dtype "auto" picks here

    assert _state(out)["features"]["result"]["target_dtype"] == str(runtime_dtype("auto")).removeprefix("torch.")
    for eng in ("sglang", "vllm"):
        assert (Path(s["exports"][eng]) / "eaglewire_contract.json").is_file()
    # the shape the bench ran (quick: the chain k = 2 only), in SGLang's spelling and in vLLM's
    assert (
        "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in s["launch"]["sglang"]
    )
    assert '"num_speculative_tokens": 2' in s["launch"]["vllm"]
    assert s["command"].startswith("eaglewire run --out ") and "--budget quick --config " in s["command"]
    assert s["total_s"] == pytest.approx(sum(t["seconds"] for t in s["stages"].values()), abs=0.1)
    md = (out / "report.md").read_text()
    assert f"Command: {s['command']}. Total: " in md
    for title in ("Wiring contract", "Data", "Training", "Doctor", "Benchmark", "Deploy"):
        assert f"## {title}" in md
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "src='http" not in html and "<script" not in html
    assert "report ->" in output


def test_second_run_redoes_nothing(finished_run, tiny, tmp_path):
    out, _ = finished_run
    before = _state(out)
    r = run_cli(tiny_config(tiny), out, tmp_path)
    assert r.exit_code == 0, r.output
    assert _state(out) == before
    assert r.output.count("done earlier") == len(runner.STAGES)


def test_changed_bench_setting_reruns_only_the_bench_in_a_new_directory(tiny, tmp_path):
    out = tmp_path / "out"
    assert run_cli(tiny_config(tiny), out, tmp_path).exit_code == 0
    first = _state(out)
    r = run_cli(tiny_config(tiny, bench={"prompts": 1}), out, tmp_path, "run2.yaml")
    assert r.exit_code == 0, r.output
    second = _state(out)
    for name in ("prompts", "regenerate", "vocab", "features", "train", "export", "doctor"):
        assert second[name] == first[name], name
    assert second["bench"]["dir"] != first["bench"]["dir"]  # never written over the other config's outputs
    assert Path(first["bench"]["dir"], "bench.json").is_file()
    assert json.loads((out / "summary.json").read_text())["config"]["bench"]["prompts"] == 1


def test_more_conversations_continue_the_same_regeneration_file(tiny, tmp_path):
    out = tmp_path / "out"
    assert run_cli(tiny_config(tiny, data={"conversations": 8}), out, tmp_path).exit_code == 0
    first = _state(out)["regenerate"]
    assert run_cli(tiny_config(tiny, data={"conversations": 12}), out, tmp_path, "b.yaml").exit_code == 0
    second = _state(out)["regenerate"]
    assert second["dir"] == first["dir"] and second["key"] != first["key"]
    assert second["result"]["conversations"] == 12 and second["result"]["new_tokens_this_run"] > 0


def test_killed_run_resumes_at_the_stage_it_died_in(tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_bench = stages.bench

    def dies(ctx, work):
        raise KeyboardInterrupt  # what a kill looks like to the stages before it: they were recorded

    monkeypatch.setattr(
        runner,
        "STAGES",
        tuple(s if s.name != "bench" else runner.Stage(s.name, s.title, dies, s.deps, s.inputs) for s in runner.STAGES),
    )
    with pytest.raises(KeyboardInterrupt):
        runner.run_pipeline(RunConfig.model_validate(tiny_config(tiny)), out, progress=lambda *a: None, log=print)
    done = _state(out)
    assert "train" in done and "bench" not in done and not (out / "report.html").exists()
    monkeypatch.setattr(
        runner,
        "STAGES",
        tuple(
            s if s.name != "bench" else runner.Stage(s.name, s.title, real_bench, s.deps, s.inputs)
            for s in runner.STAGES
        ),
    )
    logs: list[str] = []
    runner.run_pipeline(RunConfig.model_validate(tiny_config(tiny)), out, progress=lambda *a: None, log=logs.append)
    assert sum("done earlier" in line for line in logs) == len(runner.STAGES) - 1
    assert _state(out)["train"] == done["train"] and (out / "report.html").is_file()


def test_a_warm_start_keeps_its_own_vocabulary(finished_run, tiny, tmp_path):
    """Continuing a draft of the same V_d keeps its map (all its head rows trained); vocab.from_init false or
    another V_d builds one from the run's data, as without a warm start."""
    from safetensors.torch import load_file, save_file

    from eaglewire.target.loader import load_target
    from eaglewire.draft.vocab import VocabMap, load_vocab

    out, _ = finished_run
    st = _state(out)
    target = load_target(str(tiny / "model"))
    # the run's draft with a map no build from this data would give (the 200 highest ids)
    draft = tmp_path / "init"
    shutil.copytree(st["train"]["result"]["draft"], draft)
    weights = load_file(str(draft / "model.safetensors"))
    vm = VocabMap.from_target_ids(torch.arange(target.vocab_size - 200, target.vocab_size), target.vocab_size)
    weights["d2t"], weights["t2d"] = vm.d2t, vm.t2d
    save_file(weights, str(draft / "model.safetensors"))
    theirs = vm.d2t

    def vocab_of(name: str, **over):
        cfg = RunConfig.model_validate(
            tiny_config(tiny, data={"conversations": 6}, train={"init_from": str(draft)}, **over)
        )
        ctx = stages.Ctx(
            cfg,
            tmp_path,
            target,
            target.contract((2, 4, 5)),
            dirs={"regenerate": Path(st["regenerate"]["dir"])},
            log=lambda m: None,
        )
        (tmp_path / name).mkdir()
        res = stages.vocab(ctx, tmp_path / name)
        return res, load_vocab(res["file"])[0].d2t

    kept, d2t = vocab_of("kept")
    assert kept["from_warm_start"] and torch.equal(d2t, theirs)
    rebuilt, d2t = vocab_of("rebuilt", vocab={"from_init": False})
    assert not rebuilt["from_warm_start"] and not torch.equal(d2t, theirs)
    other, d2t = vocab_of("other", vocab={"draft_vocab_size": 150})
    assert not other["from_warm_start"] and d2t.numel() == 150


def test_a_copied_run_uses_its_own_stages_and_refuses_to_reuse_changed_ones(finished_run, tiny, tmp_path):
    """State paths are relative to the run folder: a copy with a changed bench setting benchmarks the copy's
    draft, not the original's; a stage output changed on disk is refused, not reused."""
    out, _ = finished_run
    copy = tmp_path / "moved" / "copy"
    shutil.copytree(out, copy)
    r = run_cli(tiny_config(tiny, bench={"prompts": 1}), copy, tmp_path)
    assert r.exit_code == 0, r.output
    st = _state(copy)
    assert st["bench"]["result"]["result"]["draft"].startswith(str(copy))
    assert all(rec["dir"].startswith(str(copy)) for rec in st.values())
    assert '"$RUN/work/' in (copy / "state.json").read_text() and str(out) not in (copy / "state.json").read_text()
    weights = Path(st["train"]["result"]["draft"]) / "model.safetensors"
    with open(weights, "r+b") as f:  # same size, a few bytes changed in the header's tail
        f.seek(40)
        f.write(b"\x00\x00\x00\x00")
    r = run_cli(tiny_config(tiny, bench={"prompts": 1}), copy, tmp_path)
    assert r.exit_code == 2 and "changed on disk" in r.output and "model.safetensors" in r.output, r.output


def test_state_of_another_tool_is_refused(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"format": "something/else"}))
    with pytest.raises(EaglewireError, match="not an eaglewire run state"):
        runner.RunState(tmp_path)


# ---------------------------------------------------------------------------------- real browser


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(finished_run, tmp_path):
    out, _ = finished_run
    url = (out / "report.html").resolve().as_uri()
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "Benchmark" in dom and "<table>" in dom and dom.count("<img") == 2
    from eaglewire import __version__

    assert 'class="machine"' in dom and " cores (" in dom and f"eaglewire {__version__}" in dom  # the header
    shot = tmp_path / "shot.png"
    subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,3000", url], capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(shot).convert("L")
    colours = img.getcolors(maxcolors=1 << 16)
    assert img.size == (1200, 3000) and colours is not None and len(colours) > 50  # text, tables and plots drawn


# ------------------------------------------------------------------------------------ DFlash family

# the full vocabulary (not DFlash's run default, its own head) so that both engines' exports are checked
DFLASH = {"name": "dflash", "block_size": 4, "anchors": 4, "reduced_vocab": False}
BOTH = ["sglang", "vllm"]
# The doctor reads block-drafter exports once doctor/block_checks.py exists (the block-drafter doctor); before it,
# a DFlash export gets EAGLE-3's checks and their errors


@pytest.fixture(scope="module")
def dflash_run(tiny, tmp_path_factory):
    """A DFlash run through the CLI's --family, its block knobs from the config file's family section; the
    plain runtime (no compiled graphs: this is about the pipeline, not speed)."""
    tmp = tmp_path_factory.mktemp("dflash_run")
    out, path = tmp / "out", tmp / "run.yaml"
    family = {k: v for k, v in DFLASH.items() if k != "name"}  # the name from --family
    path.write_text(yaml.safe_dump(tiny_config(tiny, family=family, formats=BOTH)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLEWIRE_FASTCPU", "0")
        r = CliRunner().invoke(app, ["run", "--out", str(out), "--config", str(path), "--family", "dflash"])
    errors = (
        sum(json.loads((out / "summary.json").read_text())["doctor_errors"].values())
        if out.joinpath("summary.json").is_file()
        else None
    )
    assert errors is not None and r.exit_code == (1 if errors else 0), r.output + repr(r.exception)
    return out, tmp


def test_a_dflash_run_trains_exports_and_benches_a_block_drafter(dflash_run):
    out, _ = dflash_run
    s = json.loads((out / "summary.json").read_text())
    # the file's block knobs over DFlash's run defaults (train/objectives.py): layers from the target's
    assert s["family"] == "dflash" and s["config"]["family"] == {**DFLASH, "block_gamma": 4.0, "init_from_target": True}
    assert s["taps"] == [2, 3, 4, 5, 6]  # z-lab's five default ids 1..5 of 8 layers, as boundaries
    contract = _state(out)["train"]["result"]["contract"]
    assert contract["family"] == "dflash" and contract["block"]["block_size"] == 4
    assert contract["draft_vocab_size"] == contract["target"]["vocab_size"]  # the full vocabulary, no map
    assert s["engine_ids"] == {"sglang": [1, 2, 3, 4, 5], "vllm": [1, 2, 3, 4, 5]}  # dflash_config's ids
    assert set(s["bench"]) == {"vanilla", "dflash"}  # quick's EAGLE-3 rows replaced by the family's own
    assert all(m["matches_vanilla"] == 2 for m in s["bench"].values())  # lossless on every prompt
    assert len(s["bench"]["dflash"]["per_position"]) == 3  # B - 1 drafts per round
    assert '"method": "dflash"' in s["launch"]["vllm"] and '"num_speculative_tokens": 3' in s["launch"]["vllm"]
    assert "--speculative-algorithm DFLASH" in s["launch"]["sglang"]
    assert "--speculative-num-draft-tokens 4" in s["launch"]["sglang"]
    assert set(s["doctor_errors"]) == {"sglang", "vllm"}  # both exports were checked
    assert s["verdict"].startswith("Best DFlash setting")
    t = s["tau_before_after"]  # the draft training began from is the family's own fresh one, not an EAGLE-3 draft
    assert t["family"] == "dflash" and t["start"].startswith("a fresh draft"), t
    md = (out / "report.md").read_text()
    assert md.startswith("# eaglewire run: DFlash draft for") and "block size 4 (3 drafts per pass" in md
    assert "full vocabulary" in md


def test_a_dflash_runs_exports_pass_the_doctor(dflash_run):
    s = json.loads((dflash_run[0] / "summary.json").read_text())
    assert s["doctor_errors"] == {"sglang": 0, "vllm": 0}


def test_a_dflash_run_resumes_and_its_keys_name_the_family_and_block(dflash_run, tiny):
    out, tmp = dflash_run
    before = _state(out)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLEWIRE_FASTCPU", "0")
        # the family from the file this time
        r = run_cli(tiny_config(tiny, family=DFLASH, formats=BOTH), out, tmp, "again.yaml")
    assert _state(out) == before and r.output.count("done earlier") == len(runner.STAGES)
    from eaglewire.target.loader import load_target

    tgt = load_target(str(tiny / "model"))
    keys = {
        name: runner.stage_keys(RunConfig(**tiny_config(tiny, family=fam)), tgt, (2, 4, 5))
        for name, fam in (("eagle3", {}), ("dflash", DFLASH), ("b8", {**DFLASH, "block_size": 8}))
    }
    eagle3 = RunConfig(**tiny_config(tiny))  # an EAGLE-3 run keys its stages as before the family section existed
    root = {"target": tgt.identity.__dict__, "taps": [2, 4, 5]}
    assert keys["eagle3"]["prompts"][0] == runner._sha([root, "prompts", runner.STAGES[0].inputs(eagle3), []])
    for st in ("train", "export", "doctor", "bench"):
        assert len({keys[n][st][0] for n in keys}) == 3, st  # the family and its block size key training onwards
    for st in ("regenerate", "vocab", "features"):  # the same taps: the same data and features, reused
        assert len({keys[n][st][0] for n in keys}) == 1, st


# ---------------------------------------------------------------------------------- real target


@pytest.mark.real_target
def test_short_run_on_the_real_embedded_target(tmp_path, kept_calibrations):
    """Every stage on SmolLM2-135M with tiny sizes; regeneration starts from the shipped conversations. The bench's
    runtime is calibrated as a user's run calibrates it, from the tests' kept calibration of this target where a
    session on this machine measured one (tests/conftest.py `kept_calibrations`), else measured now."""
    cfg = {
        "data": {"conversations": 3, "max_length": 256},
        "train": {
            "max_steps": 2,
            "batch_size": 2,
            "ttt_steps": 1,
            "warmup_steps": 1,
            "eval_every": 2,
            "ckpt_every": 2,
            "heldout_fraction": 0.0,
        },
        "bench": {"prompts": 1, "max_new_tokens": 6, "chain_k": 1, "num_steps": 2, "topk": 2, "num_draft_tokens": 3},
    }
    r = run_cli(cfg, tmp_path / "out", tmp_path)
    assert r.exit_code == 0, r.output + repr(r.exception)
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["engine_ids"] == {"sglang": [1, 14, 26], "vllm": [2, 15, 27]}
    assert s["data"]["from_shipped"] >= 3 and s["data"]["new_tokens_this_run"] == 0
    assert s["doctor_errors"] == {"sglang": 0, "vllm": 0, "llamacpp": 0}
    ours = {n: m for n, m in s["bench"].items() if not n.startswith("llamacpp_")}  # llama.cpp's Q4_1 is its own text
    assert all(m["matches_vanilla"] == 1 for m in ours.values())
    assert "llama-server -m" in s["launch"]["llamacpp"] and "--spec-type draft-eagle3" in s["launch"]["llamacpp"]
    from eaglewire.serve.llamacpp import find_llama_server

    if find_llama_server() is not None:  # bench.llamacpp auto: llama.cpp's rows, lossless, its tau in the verdict
        assert s["bench"]["llamacpp_eagle_chain"]["matches_llamacpp_vanilla"] == 1
        assert "llama.cpp with the same draft" in s["verdict"] and s["bench"]["llamacpp_eagle_chain"]["tau"] >= 1
