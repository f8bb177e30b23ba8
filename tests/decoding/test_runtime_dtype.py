"""--dtype of generate / bench / serve: bf16 speculative decoding emits the target's greedy choice at every
position up to bf16 rounding, chain and tree; bf16 is refused on a CPU without native bf16; a bf16 draft
on an fp32 target (--draft-dtype auto where bf16 is native) stays lossless token for token; the CLI runs
target, draft and baselines in the dtypes asked for and bench.json records them.

Why "up to bf16 rounding" and not token for token as in fp32: a verify forward of k rows does not round
like a 1-row decode step in bf16 (PyTorch's bf16 SDPA kernel and some bf16 GEMMs, e.g. K=1536, are not
batch-invariant), and bf16 logits tie exactly at ~5% of positions on SmolLM2 (ulp 0.0625 at 13): at a tie
the two forwards may pick different, equally greedy, tokens, and the texts part there. Measured on the
real target: 10 of 12 runs of 64 tokens parted from bf16 vanilla, each first at a 0-1 ulp tie.
"""

import json
import math

import pytest
import torch
from proposers import OracleProposer, RandomProposer
from tiny import VOCAB, build_draft, build_target
from typer.testing import CliRunner

from eaglewire import hw
from eaglewire.decoding.engine import SpecDecoder, greedy_reference
from eaglewire.decoding.propose import EagleProposer
from eaglewire.fastcpu.gemm import candidate_layouts
from eaglewire.fastcpu.runtime import FastRuntime
from eaglewire.decoding.tree import TreeShape
from eaglewire.errors import EaglewireError
from extras import needs_fastcpu

pytestmark = needs_fastcpu  # the CPU acceleration layer's own tests

CHAIN, TREE = TreeShape.chain(3), TreeShape(num_steps=3, topk=2, num_draft_tokens=6)
PROMPT = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
TIE_ULPS = 4  # a verify row vs a 1-row decode step of the same position: measured <= 2 bf16 ulps apart here
needs_bf16 = pytest.mark.skipif(
    not hw.native_bf16(),
    reason="this CPU has no native bf16 (AVX512-BF16/AMX): bf16 decoding is refused here, so there is nothing to run",
)


def _decode_logits(rt: FastRuntime, prompt: torch.Tensor, out: list[int]) -> torch.Tensor:
    """[len(out), V] fp32 copies of the logits of 1-row decode steps teacher-forced along `out`: what
    vanilla greedy computes at each position given the same prefix."""
    P = prompt.shape[1]
    logits, _ = rt.forward(prompt, torch.arange(P)[None], 0, logit_rows=torch.tensor([P - 1]))
    rows = [logits[0, -1].float()]
    for i, tok in enumerate(out[:-1]):
        logits, _ = rt.forward(torch.tensor([[tok]]), torch.tensor([[P + i]]), P + i)
        rows.append(logits[0, -1].float())
    return torch.stack(rows)


def _ulps_below_max(rows: torch.Tensor, values: torch.Tensor) -> list[float]:
    """rows [N, V], values [N]: how far each value is below its row's max, in bf16 ulps of that max."""
    top = rows.max(-1).values
    return [
        float(t - v) / 2.0 ** (math.floor(math.log2(abs(float(t)))) - 7) for t, v in zip(top, values)
    ]  # 7 mantissa bits


def _bf16_setup(arch: str = "llama"):
    target = build_target(arch)
    target.model.to(torch.bfloat16)
    draft, contract = build_draft(target, taps=(1, 2, 3))
    return target, draft.to(torch.bfloat16), contract


@needs_bf16
@pytest.mark.parametrize("arch,layout", [("llama", "auto"), ("qwen3", "auto"), ("llama", "dnnl")])
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_bf16_speculative_is_greedy_up_to_bf16_ties(arch, layout, shape):
    """Exact wherever the target's best token leads by more than a few ulps (so equal to bf16 vanilla up to
    its first near-tie); at most a few near-tie positions; the measured worst case here is 2 ulps."""
    if layout not in ("auto", *candidate_layouts(torch.bfloat16)):
        pytest.skip("this torch build exposes no oneDNN prepacked linear (torch.ops.mkldnn._linear_pointwise)")
    target, draft, contract = _bf16_setup(arch)
    rt = FastRuntime(target, max_len=128, layout=layout)
    assert rt.k_cache.dtype == torch.bfloat16 and rt.layers[0].o.w.dtype == torch.bfloat16
    ref = greedy_reference(rt, PROMPT, 30)
    assert len(set(ref)) > 3  # a real continuation, not one repeated token
    ref_rows = _decode_logits(rt, PROMPT, ref)
    runner_up = _ulps_below_max(ref_rows, ref_rows.topk(2, -1).values[:, 1])
    first_tie = next((i for i, g in enumerate(runner_up) if g <= TIE_ULPS), len(ref))
    # the oracle's drafts are mostly accepted, behind a wrong first sibling in the tree (so every round moves
    # the accepted branch in the KV cache); random ones almost never; the EAGLE draft is a random init
    proposers = (
        OracleProposer(ref, shape),
        EagleProposer(draft, shape, max_len=128, contract=contract),
        RandomProposer(VOCAB, shape),
    )
    for proposer in proposers:
        out, st = SpecDecoder(rt, proposer).generate(PROMPT, 30)
        if isinstance(proposer, OracleProposer):  # right until vanilla's first tie parts the texts
            assert sum(a == shape.num_steps for a in st.accepted) >= 2, st.accepted
        assert out[:first_tie] == ref[:first_tie]  # token for token up to vanilla's first near-tie
        rows = _decode_logits(rt, PROMPT, out)
        gaps = _ulps_below_max(rows, rows[torch.arange(len(out)), torch.tensor(out)])
        assert len(out) == 30 and max(gaps) <= TIE_ULPS, gaps  # past it: still a greedy choice every time
        assert sum(g > 0 for g in gaps) <= 3, gaps
        # where the best token leads by more than TIE_ULPS, the check above admits only it: most positions
        decisive = _ulps_below_max(rows, rows.topk(2, -1).values[:, 1])
        assert sum(g > TIE_ULPS for g in decisive) >= len(out) // 2, decisive


@needs_bf16
@pytest.mark.parametrize("layout", ["nt", "tn", "wx", "dnnl"])
def test_bf16_runtime_logits_close_to_hf_bf16(layout):
    if layout not in candidate_layouts(torch.bfloat16):
        pytest.skip("this torch build exposes no oneDNN prepacked linear (torch.ops.mkldnn._linear_pointwise)")
    target, _, _ = _bf16_setup()
    rt = FastRuntime(target, max_len=128, layout=layout)
    with torch.no_grad():
        ref = target.model(input_ids=PROMPT).logits.float()
    logits, _ = rt.forward(PROMPT, torch.arange(PROMPT.shape[1])[None], 0)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), ref, atol=3e-2, rtol=3e-2)  # bf16: ~3 significant digits


@needs_bf16
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_bf16_draft_on_an_fp32_target_is_lossless_token_for_token(shape):
    """--draft-dtype auto on a native-bf16 CPU: the draft reads the fp32 target's taps in bf16 and only
    proposes; the fp32 target verifies, so the output is fp32 greedy decoding exactly."""
    target = build_target()
    draft, contract = build_draft(target, taps=(1, 2, 3))
    rt = FastRuntime(target, max_len=96)
    ref = greedy_reference(rt, PROMPT, 40)
    out, st = SpecDecoder(rt, EagleProposer(draft.to(torch.bfloat16), shape, max_len=96, contract=contract)).generate(
        PROMPT, 40
    )
    assert out == ref and st.verify_steps > 0


def test_draft_dtype_choices(monkeypatch):
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert hw.draft_dtype("auto", torch.float32) is torch.float32  # emulated bf16: the target's dtype
    assert hw.draft_dtype("target", torch.float32) is torch.float32
    with pytest.raises(EaglewireError, match="without native bf16"):
        hw.draft_dtype("bfloat16", torch.float32)
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert hw.draft_dtype("auto", torch.float32) is torch.bfloat16
    assert hw.draft_dtype("target", torch.float32) is torch.float32
    assert hw.draft_dtype("float32", torch.bfloat16) is torch.float32
    with pytest.raises(ValueError, match="draft dtype must be one of"):
        hw.draft_dtype("fp8", torch.float32)


def test_runtime_dtype_choices_and_refusal(monkeypatch):
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert hw.runtime_dtype("auto") is torch.float32 and hw.runtime_dtype("float32") is torch.float32
    with pytest.raises(EaglewireError, match="bfloat16 asked for on a CPU without native bf16") as err:
        hw.runtime_dtype("bfloat16")
    assert "--dtype auto or float32" in str(err.value)
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert hw.runtime_dtype("auto") is torch.bfloat16 and hw.runtime_dtype("bfloat16") is torch.bfloat16
    monkeypatch.setenv("EAGLEWIRE_NO_BF16", "1")
    assert hw.runtime_dtype("auto") is torch.float32
    with pytest.raises(EaglewireError, match="without native bf16"):
        hw.runtime_dtype("bfloat16")


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
def test_cli_refuses_bf16_without_native_bf16_before_loading(command, monkeypatch):
    from eaglewire.cli.app import app
    from eaglewire.target import loader

    monkeypatch.setenv("EAGLEWIRE_NO_BF16", "1")
    monkeypatch.setattr(loader, "load_target", lambda *a, **k: pytest.fail("the target was loaded"))
    extra = ["-p", "hi"] if command == "generate" else []
    r = CliRunner().invoke(app, [command, "--dtype", "bfloat16", *extra])
    assert r.exit_code == 2 and "without native bf16" in r.output and "--dtype auto or float32" in r.output
    r = CliRunner().invoke(app, [command, "--dtype", "fp16", *extra])
    assert r.exit_code == 2 and "unknown --dtype" in r.output and "float32 | bfloat16 | auto" in r.output


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A tiny random Llama on disk with the real SmolLM2 tokenizer, its draft, and a 2-question file."""
    from test_server import _tiny_target_dir

    from eaglewire.export.checkpoint import save_checkpoint
    from eaglewire.target.loader import load_target

    d = tmp_path_factory.mktemp("dtype")
    tdir = _tiny_target_dir(d)
    draft, contract = build_draft(load_target(str(tdir)), taps=(1, 2, 3))
    save_checkpoint(draft, contract, d / "draft")
    questions = d / "q.jsonl"
    questions.write_text(
        "\n".join(
            json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": q}]})
            for i, q in enumerate(["Name a colour.", "Count to five."])
        )
    )
    return tdir, d / "draft", questions


@needs_bf16
def test_cli_bench_and_generate_run_in_bf16(tiny_dirs, tmp_path):
    from eaglewire.cli.app import app

    tdir, draft, questions = tiny_dirs
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "--target",
            str(tdir),
            "--draft",
            str(draft),
            "--questions",
            str(questions),
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path / "b"),
            "--dtype",
            "bfloat16",
            "--methods",
            "hf_generate,vanilla,eagle_chain,eagle_tree",
        ],
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert result["dtype"] == "bfloat16" and "bfloat16" in (tmp_path / "b" / "bench.md").read_text()
    assert set(result["methods"]) == {"hf_generate", "vanilla", "eagle_chain", "eagle_tree"}
    r = CliRunner().invoke(
        app,
        [
            "generate",
            "--target",
            str(tdir),
            "--draft",
            str(draft),
            "-p",
            "Hi.",
            "--json",
            "--max-new-tokens",
            "8",
            "--dtype",
            "auto",
        ],
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "(bfloat16, from --dtype auto)" in r.stderr and len(json.loads(r.stdout)["tokens"]) <= 8


@needs_bf16
def test_cli_bench_fp32_target_with_the_auto_bf16_draft(tiny_dirs, tmp_path):
    """The default: an fp32 target, the draft in bf16 where native; output identical to fp32 vanilla on every
    prompt; bench.json and bench.md say both dtypes. --draft-dtype target keeps the draft in fp32."""
    from eaglewire.cli.app import app

    tdir, draft, questions = tiny_dirs
    common = [
        "bench",
        "--target",
        str(tdir),
        "--draft",
        str(draft),
        "--questions",
        str(questions),
        "--limit",
        "2",
        "--max-new-tokens",
        "12",
        "--methods",
        "vanilla,eagle_chain,eagle_tree",
    ]
    r = CliRunner().invoke(app, common + ["--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output + repr(r.exception)
    result = json.loads((tmp_path / "a" / "bench.json").read_text())
    assert result["dtype"] == "float32" and result["draft_dtype"] == "bfloat16"
    assert all(m["matches_vanilla"] == 2 for m in result["methods"].values())
    assert "float32 (our EAGLE rows' draft: bfloat16)" in (tmp_path / "a" / "bench.md").read_text()
    r = CliRunner().invoke(app, common + ["--out", str(tmp_path / "b"), "--draft-dtype", "target"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["draft_dtype"] == "float32"


def test_the_cpu_description_names_isa_caps_set_in_the_environment(monkeypatch):
    """A verify cost measured with the kernels capped to AVX2 on an AVX-512 machine must say so."""
    from eaglewire.hw import ISA_CAPS, describe_cpu

    for k in ISA_CAPS:
        monkeypatch.delenv(k, raising=False)
    assert describe_cpu()["isa_caps"] == {}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert describe_cpu()["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
