"""llama.cpp's rules come from llama.cpp's own source, per release: the source each llama-cpp-python sdist vendors
(scripts/llamacpp_build.sh unpacks it to $EAGLEWIRE_LLAMACPP/<version>/src). Its converter's Python is run on
id lists (the expressions it evaluates, extracted with `ast`), its gguf-py constants are loaded and compared
with eaglewire's layout record (export/llamacpp_layout.py), and the C++ lines that decide a layer id's meaning
are found in its server and model code.

Locally, without $EAGLEWIRE_LLAMACPP and without the default cache folder, this skips; with the variable set
(CI) a missing release's source fails.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest

from eaglewire.contract import default_taps, from_engine, to_engine, translate
from eaglewire.export import llamacpp_layout as lay
from eaglewire.export.engines import IDS_KEY, engine_field, engine_for

ENV = os.environ.get("EAGLEWIRE_LLAMACPP")
ROOT = Path(ENV) if ENV else Path.home() / ".cache" / "eaglewire" / "llamacpp"
if not ENV and not any((ROOT / v / "src").is_dir() for v in lay.RELEASES):
    pytest.skip(
        "llama.cpp's source is not unpacked: bash scripts/llamacpp_build.sh (sets up $EAGLEWIRE_LLAMACPP)",
        allow_module_level=True,
    )
RELEASES = sorted(lay.RELEASES)


def src(version: str) -> Path:
    path = ROOT / version / "src"
    assert (path / "convert_hf_to_gguf.py").is_file(), (
        f"llama.cpp {version}'s source is not at {path}: run bash scripts/llamacpp_build.sh {version}"
    )
    return path


def read(version: str, rel: str) -> str:
    return (src(version) / rel).read_text(encoding="utf-8")


def _expr(code: str, target: str, kind: type = ast.expr) -> ast.expr:
    """The value expression of the first assignment to `target` in `code` whose value is a `kind`."""
    for node in ast.walk(ast.parse(code)):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, kind)
            and any(isinstance(t, ast.Name) and t.id == target for t in node.targets)
        ):
            return node.value
    raise AssertionError(f"no assignment to {target} in the converter")


def _run(expr: ast.expr, **names) -> object:
    return eval(compile(ast.Expression(expr), "<converter>", "eval"), {"__builtins__": {}}, names)


def test_every_release_read_is_unpacked():
    """The folder holds a source for each release the record names, and no release the record lacks."""
    found = sorted(p.parent.name for p in ROOT.glob("*/src") if (p / "convert_hf_to_gguf.py").is_file())
    assert set(RELEASES) <= set(found), f"record releases {RELEASES}, unpacked {found}"
    assert set(found) <= set(RELEASES), (
        f"unpacked llama.cpp releases the record does not know: {set(found) - set(RELEASES)}"
    )


@pytest.mark.parametrize("version", RELEASES)
def test_eagle3_converter_ids(version):
    """The converter's default is [2, n//2, n-3], the boundaries eaglewire calls default_taps; it reads the
    TOP-LEVEL eagle_aux_hidden_state_layer_ids (as is) exactly in the releases the record says."""
    code = read(version, "conversion/llama.py")
    default = _expr(code, "target_layers", ast.List)
    for L in (8, 24, 30, 61):
        ids = _run(default, target_num_layers=L)
        assert tuple(ids) == to_engine(default_taps(L), "llamacpp", L), (version, L, ids)
    reads = f'eagle3_raw_config.get("{IDS_KEY}")' in code
    assert reads == lay.RELEASES[version].converter_reads_ids
    assert "eagle_config" not in code  # a nested eagle_config (SGLang's layout) is never read


@pytest.mark.parametrize("version", RELEASES)
def test_eagle3_converter_tensors(version):
    """t2d dropped, d2t written as absolute ids in I64, hidden_norm -> attn_norm_2, q/k permuted."""
    code = read(version, "conversion/llama.py")
    assert re.search(r'if name == "t2d":\s*\n\s*#[^\n]*\n\s*return', code), "t2d is no longer dropped"
    assert "data = data + np.arange(data.size, dtype=np.int64)" in code and "GGMLQuantizationType.I64" in code
    assert 'name.endswith(".hidden_norm.weight")' in code and "MODEL_TENSOR.ATTN_NORM_2, bid" in code
    assert (
        re.search(
            r"class LlamaModel\(TextModel\):\n\s+model_arch = gguf.MODEL_ARCH.LLAMA\n\s+undo_permute = True", code
        )
        and lay.EAGLE3.permute_qk
    )
    if "norm_before_fc" in lay.RELEASES[version].eagle3_norms:
        assert 'if name == "input_norm.weight":' in code and "MODEL_TENSOR.ENC_OUTPUT_NORM" in code
    rope = read(version, "src/llama-model.cpp")
    after = rope[rope.index("case LLM_ARCH_EAGLE3:", rope.index("llama_model_rope_type")) :]
    assert re.search(r"return (LLAMA_ROPE_TYPE_\w+)", after).group(1) == "LLAMA_ROPE_TYPE_NORM"


@pytest.mark.parametrize("version", RELEASES)
def test_eagle3_server_reads_layer_inputs(version):
    """The server turns on the INPUT of layer id (the graph stores each layer's input before it), exactly 3 ids,
    one decoder layer, the norm keys the release record lists."""
    spec, model = read(version, "common/speculative.cpp"), read(version, "src/models/eagle3.cpp")
    assert "llama_set_embeddings_layer_inp(ctx_tgt, (uint32_t) target_layer_ids[k], true);" in spec
    assert "for (int il = 0; il < n_layer; ++il) {\n        res->t_layer_inp[il] = inpL;" in read(
        version, "src/models/llama.cpp"
    )
    assert "res->t_h_nextn" not in read(version, "src/models/llama.cpp")  # id L has nothing to read on llama
    assert "target_layer_ids_n != 3" in spec and "target_layer_ids.size() != 3" in model
    assert engine_for("llamacpp", version).num_taps == lay.EAGLE3.num_taps == 3
    assert "GGML_ASSERT(n_layer == 1);" in model and lay.EAGLE3.max_layers == 1
    keys = {
        k
        for k, c in (
            ("norm_before_residual", "LLM_KV_NORM_BEFORE_RESIDUAL"),
            ("norm_before_fc", "LLM_KV_NORM_BEFORE_FC"),
        )
        if c in model
    }
    assert keys == set(lay.RELEASES[version].eagle3_norms) == set(engine_for("llamacpp", version).norms)
    # the draft's own prenorm state is fed back (norm_output: the post-norm state, is not implemented)
    assert "// Output prenorm state" in model or "prenorm" in model


@pytest.mark.parametrize("version", RELEASES)
def test_dflash_rule(version):
    """Where the release serves DFlash: its converter writes target_layer_ids + 1 and the server captures layer
    inputs: the same boundaries as z-lab's ids, in the llamacpp convention."""
    has = (src(version) / "src/models/dflash.cpp").is_file()
    assert has == ("dflash" in lay.RELEASES[version].families)
    if not has:
        return
    code = read(version, "conversion/qwen.py")
    plus = _expr(code[code.index("class DFlashModel") :], "extract_layer_ids")
    field = engine_field("llamacpp", "llamacpp", "dflash")
    for L, ids in ((30, [1, 8, 14, 20, 26]), (8, [0, 3, 6]), (36, [2, 17, 33])):
        assert tuple(_run(plus, target_layer_ids=ids)) == translate(ids, "zlab", field.convention, L)
    spec = read(version, "common/speculative.cpp")
    dflash = spec[spec.index("common_speculative_impl_draft_dflash") :]
    assert "llama_set_embeddings_layer_inp(ctx_tgt, (uint32_t) target_layer_ids[k], true);" in dflash
    assert "llama_set_embeddings_nextn(ctx_tgt" not in dflash[: dflash.index("llama_set_causal_attn")]
    assert '"dflash.block_size"' in spec and '"dflash.attention.causal"' in spec
    assert "mask_token_id = llama_vocab_mask(llama_model_get_vocab(model_dft));" in spec
    assert "dsv4_hc_mult > 0 ? LLAMA_ROPE_TYPE_NORM : LLAMA_ROPE_TYPE_NEOX" in read(version, "src/llama-model.cpp")
    assert not lay.DFLASH.permute_qk


@pytest.mark.parametrize("version", RELEASES)
def test_dflash_block_is_n_max_plus_one(version):
    """llama.cpp drafts DFlash's block as [id_last, MASK x n_max] (n_max = --spec-draft-n-max, clamped to
    block_size - 1) and reads slots 1..n_max: below block_size - 1 the block is SHORTER than the one the draft
    was trained on (vLLM and our engine draft the whole block and verify its first k), which changes every
    slot's draft of a non-causal draft. The layout record says so, and the export's line serves the whole block."""
    if "dflash" not in lay.RELEASES[version].families:
        return
    spec = read(version, "common/speculative.cpp")
    dflash = spec[spec.index("struct common_speculative_impl_draft_dflash") :]
    dflash = dflash[: dflash.index("\n};\n")]
    assert "const int32_t n_draft = params.n_max;" in dflash
    assert "const int32_t n_block_tokens = n_draft + (is_dspark && sample_from_anchor ? 0 : 1);" in dflash
    assert "batch.add(i == 0 ? dp.id_last : mask_token_id, n + i, seq_id" in dflash
    assert "const int32_t n_draft_max = is_dspark && sample_from_anchor ? block_size : block_size - 1;" in dflash
    assert "for (int32_t i = 1; i < n_block_tokens; ++i) {" in dflash  # slots 1..n_max, the anchor not read
    assert lay.DFLASH.block_drafted == "n_max + 1"


def _constants(version: str):
    spec = importlib.util.spec_from_file_location(
        f"llamacpp_constants_{version.replace('.', '_')}", src(version) / "gguf-py/gguf/constants.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a pinned release's constants table: enums and dicts, no I/O
    return module


@pytest.mark.parametrize("version", RELEASES)
def test_layout_strings_are_llamacpps(version):
    """Arch names, metadata keys and tensor names of the layout record, against gguf-py's constants."""
    c = _constants(version)
    names = {c.MODEL_ARCH_NAMES[a]: a for a in c.MODEL_ARCH_NAMES}
    for fam in (lay.FAMILIES[f] for f in lay.RELEASES[version].families):
        arch = names[fam.arch]
        known = {c.TENSOR_NAMES[t] for t in c.MODEL_TENSORS[arch]}
        for _, gg in fam.tensors:
            base = gg.removesuffix(".weight")
            if (
                base == "enc.output_norm"
                and fam is lay.EAGLE3
                and "norm_before_fc" not in lay.RELEASES[version].eagle3_norms
            ):
                continue
            assert base in known, f"{version}: {fam.arch} has no tensor {base!r}"
        keys = (
            {v for k, v in vars(c.Keys.LLM).items() if k.isupper()}
            | {v for k, v in vars(c.Keys.Attention).items() if k.isupper()}
            | {v for k, v in vars(c.Keys.Rope).items() if k.isupper()}
        )
        wanted = (
            set(lay.HPARAMS.values())
            | {lay.TARGET_LAYERS, lay.TARGET_HIDDEN_SIZE, lay.NORM_BEFORE_RESIDUAL}
            | ({lay.NORM_BEFORE_FC} if "norm_before_fc" in lay.RELEASES[version].eagle3_norms else set())
            | ({lay.BLOCK_SIZE, lay.CAUSAL, lay.SLIDING_WINDOW} if fam is lay.DFLASH else set())
        )
        missing = sorted(wanted - keys)
        if version == "0.3.30":  # this release's converter writes the eagle3 keys by hand (add_array / add_bool)
            code = read(version, "conversion/llama.py")
            missing = [k for k in missing if f'f"{{self.gguf_writer.arch}}.{k.split(".", 1)[1]}"' not in code]
        assert not missing, f"{version}: keys the layout writes that llama.cpp does not define: {missing}"
    assert c.Keys.Tokenizer.MASK_ID == lay.MASK_TOKEN_KEY and c.Keys.General.ARCHITECTURE == lay.ARCH_KEY


def test_convention_is_the_layer_input():
    """The llamacpp convention: id = boundary (the input of layer id), 0 reachable, L refused."""
    for L in (4, 30):
        assert to_engine((0, 1, L - 1), "llamacpp", L) == (0, 1, L - 1)
        assert from_engine((0, L - 1), "llamacpp", L) == (0, L - 1)
    with pytest.raises(Exception, match="cannot express tap boundary 30"):
        to_engine((2, 15, 30), "llamacpp", 30)
