"""`eaglewire export --format llamacpp`: a native EAGLE-3 or DFlash draft as the GGUF file llama-server loads with
`-md`, written with the PyPI `gguf` package from the layout record (export/llamacpp_layout.py), plus the contract
side file. The read direction (GGUF -> native, strict) is export/gguf_import.py.

What llama.cpp cannot express is refused here, never approximated: a family the release does not serve, an
EAGLE-3 draft of other than 3 taps or 1 layer, a norm flag the release does not read, the final boundary (the
llamacpp convention refuses it), a DFlash block wiring llama.cpp does not compute (anchor-first slots, sliding
or per-layer causal attention).

The vocabulary: llama-server refuses a draft whose vocabulary differs from the target's (type, BOS/EOS, token
texts: common/speculative.cpp common_speculative_are_compatible), and DFlash takes its mask token from the
draft's vocabulary; so the draft carries the `tokenizer.*` keys of the very target GGUF it will be served with
(`vocab_from`), the DFlash mask token set to the contract's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from eaglewire.contract import WiringContract
from eaglewire.errors import CheckpointError
from eaglewire.export import llamacpp_layout as lay
from eaglewire.export.base import CONTRACT_FILE, is_export

FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}  # gguf.LlamaFileType (general.file_type)
Q8_BLOCK = 32  # gguf.GGML_QUANT_SIZES[Q8_0][0]: a Q8_0 row must be a multiple of it


def permute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF's rotate-half q/k rows -> llama.cpp's interleaved (NORM rope) rows, as conversion/llama.py's
    LlamaModel.permute: [n_head, 2, hd/2, in] -> [n_head, hd/2, 2, in]."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of permute_qk (GGUF rows -> HF rows)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _refuse(what: str, expected: str, found: str, fix: str) -> CheckpointError:
    return CheckpointError(f"llama.cpp cannot serve this draft: {what}", expected=expected, found=found, fix=fix)


def check_gguf_exportable(draft: Any, contract: WiringContract, version: str | None = None) -> lay.GGUFFamily:
    """The family record, after refusing what llama.cpp `version` would load but run differently."""
    rel = lay.release(version)
    if contract.family not in lay.FAMILIES or contract.family not in rel.families:
        raise _refuse(
            f"llama.cpp {rel.version} has no {contract.family} drafter",
            " or ".join(rel.families),
            contract.family,
            f"use a llama.cpp release that serves it ({', '.join(lay.RELEASES)})",
        )
    fam, cfg = lay.FAMILIES[contract.family], draft.cfg
    if fam.num_taps is not None and contract.num_taps != fam.num_taps:
        raise _refuse(
            f"{fam.arch} reads exactly {fam.num_taps} target layers",
            f"{fam.num_taps} taps",
            f"{contract.num_taps} taps",
            "retrain with 3 taps, or serve on vLLM / SGLang",
        )
    if fam.max_layers is not None and cfg.num_layers > fam.max_layers:
        raise _refuse(
            f"{fam.arch} builds {fam.max_layers} decoder layer",
            f"num_layers <= {fam.max_layers}",
            f"num_layers={cfg.num_layers}",
            "serve a multi-layer EAGLE-3 draft on vLLM",
        )
    norms = fam.norms_read(rel)
    if missing := sorted(cfg.norm.on - norms):
        raise _refuse(
            f"llama.cpp {rel.version} does not implement {missing}",
            f"only {sorted(norms)}",
            f"draft trained with {sorted(cfg.norm.on)}",
            "retrain with `eaglewire train --norms eagle3`, or serve on vLLM (every norm flag)",
        )
    block = contract.block
    if block is not None and (block.anchor_layout != "bonus" or block.sliding_layers):
        raise _refuse(
            "llama.cpp's DFlash runs every layer with one attention rule over a bonus-anchor block",
            "anchor_layout bonus, no sliding_attention layers",
            f"anchor_layout={block.anchor_layout}, sliding_layers={list(block.sliding_layers)}",
            "retrain with the default block wiring",
        )
    contract.engine_ids("llamacpp")  # refuses a tap llama.cpp cannot capture (the final boundary)
    return fam


def _hparams(w: Any, fam: lay.GGUFFamily, cfg: Any, contract: WiringContract, dtype: str) -> None:
    import gguf

    k = fam.key
    for key, value in (
        ("block_count", cfg.num_layers),
        ("context_length", cfg.max_position_embeddings),
        ("embedding_length", cfg.hidden_size),
        ("feed_forward_length", cfg.intermediate_size),
        ("head_count", cfg.num_attention_heads),
        ("head_count_kv", cfg.num_key_value_heads),
        ("key_length", cfg.head_dim),
        ("value_length", cfg.head_dim),
    ):
        w.add_uint32(k(lay.HPARAMS[key]), int(value))
    w.add_float32(k(lay.HPARAMS["rope_freq_base"]), float(cfg.rope_theta))
    w.add_float32(k(lay.HPARAMS["rms_eps"]), float(cfg.rms_norm_eps))
    w.add_uint32(lay.FILE_TYPE_KEY, FILE_TYPES[dtype])
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    w.add_array(k(lay.TARGET_LAYERS), [int(i) for i in contract.engine_ids("llamacpp")])
    if not fam.block:  # EAGLE-3: its own vocabulary size, rope dims, target width and norm keys
        w.add_uint32(k(lay.HPARAMS["vocab_size"]), int(cfg.vocab_size))
        w.add_uint32(k(lay.HPARAMS["rope_dimension_count"]), int(cfg.head_dim))
        w.add_uint32(k(lay.TARGET_HIDDEN_SIZE), int(cfg.target_hidden_size))
        w.add_bool(k(lay.NORM_BEFORE_RESIDUAL), bool(cfg.norm.norm_before_residual))
        w.add_bool(k(lay.NORM_BEFORE_FC), bool(cfg.norm.norm_before_fc))
    else:
        assert contract.block is not None
        w.add_uint32(k(lay.BLOCK_SIZE), int(contract.block.block_size))
        w.add_bool(k(lay.CAUSAL), bool(contract.block.causal))  # explicit: llama.cpp's default is non-causal


def _copy_vocab(w: Any, vocab_from: Path) -> None:
    """The target GGUF's tokenizer.* keys, as they are (llama-server compares them with the target's)."""
    import gguf

    reader = gguf.GGUFReader(str(vocab_from))
    fields = [f for name, f in reader.fields.items() if name.startswith(lay.TOKENIZER_PREFIX)]
    if not any(f.name == "tokenizer.ggml.model" for f in fields):
        raise CheckpointError(
            f"{vocab_from} holds no vocabulary",
            expected="a GGUF with tokenizer.ggml.* keys (the target GGUF llama-server will load with -m)",
            found=f"{len(fields)} tokenizer keys",
            fix="pass the target's GGUF (a --vocab-only conversion of the target also works)",
        )
    for f in fields:
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)


def _weights(fam: lay.GGUFFamily, draft: Any, dtype: str, with_embedding: bool) -> list[tuple[str, np.ndarray, Any]]:
    """(GGUF name, data, raw dtype) of every tensor llama.cpp reads, in the state dict's order."""
    import gguf

    cfg, out = draft.cfg, []
    q = gguf.GGMLQuantizationType
    for name, t in draft.state_dict().items():
        if name in fam.dropped or (name == "embed_tokens.weight" and not with_embedding):
            continue
        gname = fam.gguf_name(name)
        if gname is None:
            raise CheckpointError(
                f"the {fam.arch} GGUF layout has no place for {name!r}",
                expected="the weights llama.cpp reads",
                found=name,
                fix="a draft built by this eaglewire has none: the checkpoint is from another version",
            )
        t = t.detach().cpu()
        if name == lay.D2T:  # llama.cpp scatters logits to d2t's ABSOLUTE target ids (int64)
            out.append((gname, (t.to(torch.int64) + torch.arange(t.numel())).numpy(), q.I64))
            continue
        if fam.permute_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
            t = permute_qk(t, cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads)
        data = t.to(torch.float32).numpy()  # [out, in] -> GGUF ne = (in, out)
        if data.ndim < 2 or dtype == "f32":  # norms stay f32 in every file type, as llama.cpp's converter does
            out.append((gname, data, q.F32))
        elif dtype == "f16":
            out.append((gname, data.astype(np.float16), q.F16))
        else:
            kind = {"bf16": q.BF16, "q8_0": q.Q8_0, "q4_0": q.Q4_0}[dtype]
            if kind != q.BF16 and data.shape[-1] % Q8_BLOCK:  # Q4_0's block is Q8_0's 32 too
                raise CheckpointError(
                    f"{gname} cannot be stored as {kind.name}",
                    expected=f"rows a multiple of {Q8_BLOCK}",
                    found=f"shape {list(data.shape)}",
                    fix="export with --dtype f16 or bf16",
                )
            out.append((gname, gguf.quants.quantize(data, kind), kind))
    return out


def write_gguf(
    path: Path,
    draft: Any,
    contract: WiringContract,
    *,
    dtype: str = "f32",
    vocab_from: Path | None = None,
    with_embedding: bool = False,
    version: str | None = None,
) -> None:
    """The GGUF file of `draft` at `path`. vocab_from: the target GGUF whose vocabulary the draft carries (None:
    none; llama-server then refuses the pair, so only tests and the doctor write such a file)."""
    import gguf

    if dtype not in FILE_TYPES:
        raise CheckpointError(f"unknown GGUF dtype {dtype!r}", expected=", ".join(FILE_TYPES), found=dtype)
    fam = check_gguf_exportable(draft, contract, version)
    draft.cfg.require_matches(contract)
    w = gguf.GGUFWriter(str(path), fam.arch)
    w.add_name(f"eaglewire {fam.family} draft for {contract.target.name}")
    _hparams(w, fam, draft.cfg, contract, dtype)
    if vocab_from is not None:
        _copy_vocab(w, Path(vocab_from))
    if contract.block is not None:  # the DFlash mask token is the draft vocabulary's (llama_vocab_mask)
        if lay.MASK_TOKEN_KEY in w.kv_data[0]:
            del w.kv_data[0][lay.MASK_TOKEN_KEY]
        w.add_mask_token_id(int(contract.block.mask_token_id))
    for name, data, raw in _weights(fam, draft, dtype, with_embedding):
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export_gguf(
    draft: Any,
    contract: WiringContract,
    out: Path,
    *,
    dtype: str = "f32",
    vocab_from: Path | None = None,
    with_embedding: bool = False,
    version: str | None = None,
    force: bool = False,
    inputs: tuple[Path, ...] = (),
) -> Path:
    """DIR/draft.gguf + DIR/eaglewire_contract.json, swapped into place whole (eaglewire.outputs)."""
    from eaglewire.outputs import replace_dir
    from eaglewire.safeio import atomic_write_json

    check_gguf_exportable(draft, contract, version)  # before any work

    def fill(tmp: Path) -> None:
        write_gguf(
            tmp / lay.GGUF_FILE,
            draft,
            contract,
            dtype=dtype,
            vocab_from=vocab_from,
            with_embedding=with_embedding,
            version=version,
        )
        atomic_write_json(tmp / CONTRACT_FILE, contract.to_dict())

    return replace_dir(
        Path(out),
        fill,
        names=(lay.GGUF_FILE, CONTRACT_FILE),
        owned=is_export,
        force=force,
        inputs=inputs,
        what="export",
    )


def server_line(contract: WiringContract, out: Path, target_gguf: Path | str | None = None, n_max: int = 3) -> str:
    """The llama-server command that serves the export (DFlash: n_max is the block's drafts per round)."""
    fam = lay.FAMILIES[contract.family]
    if contract.block is not None:
        n_max = contract.block.drafts_per_round
    return (
        f"llama-server -m {target_gguf or 'TARGET.gguf'} -md {Path(out) / lay.GGUF_FILE} "
        f"--spec-type {fam.spec_type} --spec-draft-n-max {n_max}"
    )
