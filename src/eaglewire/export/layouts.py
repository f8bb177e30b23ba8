"""Configs and weight names of each engine's layout, written and read from its record (export/engines.py:
convention, where the ids live, layer-0 prefix, norms, config style), against the engines' loaders (the
layer-id conventions are eaglewire.contract's table; the loader facts of each engine are these):

    sglang      LlamaForCausalLMEagle3, midlayer.*, eagle_config.eagle_aux_hidden_state_layer_ids (SGLang's
                rule, chosen explicitly), use_aux_hidden_state, draft_vocab_size, tie_word_embeddings false
                (else SGLang reuses the embedding as the head), fc_norm / norm_output
    vllm        speculators config (no top-level model_type, so vLLM takes its speculators path):
                speculators_model_type eagle3, a FULL transformer_layer_config, top-level
                eagle_aux_hidden_state_layer_ids in vLLM's meaning, every norm flag written explicitly
                (vLLM's speculators path defaults norm_before_residual to True), layers.N.*
    eagle       SafeAILab EAGLE: plain Llama config + draft_vocab_size, midlayer.*, taps hard-coded
    specforge   SpecForge's export: LlamaForCausalLMEagle3, midlayer.*, ids in SpecForge's meaning, exactly
                3 taps (its fc is hard-coded to 3*H), norm_output in SpecForge's meaning (below)
Limits that would make an engine silently compute something else are refused at export (e.g. SGLang
never reads norm_before_fc or norm_before_residual; SafeAILab EAGLE has no norm flags at all).

`norm_output` means two different things: in SGLang and vLLM it is "feed the POST-norm state to the
next draft step" (default false); in SpecForge 0.2.0 (llama3_eagle.py compute_logits) it is "apply the
final norm before lm_head" (default true), and its TTT always feeds the pre-norm state. Every eaglewire
draft applies the final norm, so SpecForge exports say norm_output: true, eaglewire's own norm_output
(post-norm feedback) cannot be exported to SpecForge, and an SGLang export (norm_output: false) is not a
SpecForge export (found by loading our exports with SpecForge's own class: tests/export/test_real_clients.py).
"""

from __future__ import annotations

from typing import Any

from eaglewire.contract import WiringContract
from eaglewire.norms import NORM_PRESETS, NormFlags
from eaglewire.draft.config import DraftConfig
from eaglewire.export.engines import ENGINES, IDS_KEY, Engine
from eaglewire.errors import CheckpointError
from eaglewire.safeio import field_of

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config layout this writes


def check_exportable(layout: Engine, cfg: DraftConfig) -> None:
    """Refuse drafts the engine would load but run differently (a silent failure otherwise)."""
    if cfg.num_layers > 1 and not layout.multi_layer:
        raise CheckpointError(
            f"{layout.name} cannot hold a {cfg.num_layers}-layer draft",
            expected="a 1-layer draft for this format",
            found=f"num_layers={cfg.num_layers}",
            fix="export to vllm/speculators (layers.N.*); SGLang versions name extra layers "
            "differently (additional_layers.* vs layers.N.*)",
        )
    if layout.num_taps is not None and cfg.num_taps != layout.num_taps:
        n = layout.num_taps
        raise CheckpointError(
            f"{layout.name} drafts read exactly {n} taps",
            expected=f"{n} taps (its fc is {n}*H wide and it demands {n} layer ids)",
            found=f"{cfg.num_taps} taps",
            fix="export to vllm/speculators or sglang, or retrain with 3 taps",
        )
    used = cfg.norm.on
    missing = sorted(used - layout.norms)
    if missing:
        serving = [e.name for e in ENGINES.values() if e.serves_eagle3 and used <= e.norms]
        fits = [n for n, f in NORM_PRESETS.items() if f.on <= layout.norms]
        raise CheckpointError(
            f"{layout.name} does not implement {missing}",
            expected=f"only {sorted(layout.norms)}",
            found=f"draft trained with {sorted(used)}",
            fix=f"the engine would run the draft without these norms: serve it on "
            f"{' or '.join(serving)}, or retrain with `eaglewire train --norms "
            f"{'|'.join(fits)}`",
        )


def native_to(layout: Engine, name: str) -> str:
    if name.startswith("layers.0."):
        return layout.prefix0 + name[len("layers.0.") :]
    return name


def from_native(layout: Engine, name: str) -> str:
    if name.startswith(layout.prefix0):
        return "layers.0." + name[len(layout.prefix0) :]
    if layout.prefix0 != "layers.0." and name.startswith("layers."):
        raise KeyError(name)  # a speculators-style name inside a midlayer checkpoint
    return name


def llama_fields(cfg: DraftConfig, dtype: str) -> dict[str, Any]:
    """A complete Llama config for the draft's decoder layer(s)."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "pretraining_tp": 1,
    }


def make_config(
    layout: Engine, cfg: DraftConfig, contract: WiringContract, dtype: str, verifier: str | None = None
) -> dict[str, Any]:
    """`verifier`: what vLLM/speculators load as the target (path or hub id); default the target's name."""
    ids = list(contract.engine_ids(layout.convention_for(contract.target.architecture)))
    norm = cfg.norm.__dict__
    if layout.config_style == "speculators":
        layer = {
            **llama_fields(cfg, dtype),
            "architectures": ["LlamaForCausalLM"],
            "num_aux_hidden_states": cfg.num_taps,
            "fc_norm": norm["fc_norm"],
            "norm_output": norm["norm_output"],
        }
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION,
            "transformer_layer_config": layer,
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            IDS_KEY: ids,
            **norm,
            "torch_dtype": dtype,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {
                    "name_or_path": verifier or contract.target.name,
                    "architectures": [contract.target.architecture],
                },
            },
        }
    plain = layout.config_style == "llama"
    out = {
        **llama_fields(cfg, dtype),
        "architectures": ["LlamaForCausalLM" if plain else "LlamaForCausalLMEagle3"],
        "draft_vocab_size": cfg.draft_vocab_size,
        "bias": False,
    }
    if cfg.target_hidden_size != cfg.hidden_size:
        # EAGLE (and SGLang) then stop taking the embedding from the target: it must be in the checkpoint.
        out["target_hidden_size"] = cfg.target_hidden_size
    if not plain:
        out["eagle_config"] = {IDS_KEY: ids, "use_aux_hidden_state": True}
        out.update(num_aux_hidden_states=cfg.num_taps, fc_norm=norm["fc_norm"], norm_output=norm["norm_output"])
    if layout.norm_output_is_final_norm:
        out["norm_output"] = True  # SpecForge's meaning: final norm before lm_head (see the module docstring)
    return out


def config_ids(layout: Engine, config: dict[str, Any], where: str = "config.json") -> list[int] | None:
    """The layer ids where an export for this engine writes them (None: absent, or hard-coded taps); anything
    but a list of at most SIZE_LIMITS['num_taps'] ints is refused, naming `where` and the key."""
    from eaglewire.limits import SIZE_LIMITS

    if layout.hard_coded_taps:
        return None
    node: Any = config
    for part in layout.id_keys[0].split("."):
        node = node.get(part) if isinstance(node, dict) else None
    ok = (
        node is None
        or isinstance(node, list)
        and 0 < len(node) <= SIZE_LIMITS["num_taps"]
        and all(type(i) is int for i in node)
    )
    if not ok:
        raise CheckpointError(
            f"{where}: {layout.id_keys[0]} is not a list of layer ids",
            expected=f"a list of 1 to {SIZE_LIMITS['num_taps']} integers",
            found=repr(node)[:80],
            fix="re-export from the native draft (eaglewire export)",
        )
    return None if node is None else [int(i) for i in node]


def _rope_theta(base: dict[str, Any]) -> float:
    """The RoPE base where either transformers generation writes it: `rope_theta` (4.x) or
    `rope_parameters.rope_theta` (5.x; speculators >= 0.9 saves this form). Missing, the old default: a
    draft read with the wrong base scores positions it was not trained with."""
    rope = base.get("rope_parameters")
    theta = base.get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None)
    return float(theta or 10000.0)


def draft_config_from(layout: Engine, config: dict[str, Any], num_taps: int) -> DraftConfig:
    """DraftConfig from an exported config (the inverse of make_config)."""
    raw = config.get("transformer_layer_config") if layout.config_style == "speculators" else config
    where = f"{layout.name} config.json" + (" transformer_layer_config" if raw is not config else "")
    if not isinstance(raw, dict):
        raise CheckpointError(
            f"{where} is not an object",
            expected="a JSON object",
            found=repr(raw)[:80],
            fix="the directory is not an export of this format, or the file is damaged",
        )
    base: dict[str, Any] = raw
    for key in ("hidden_size", "num_attention_heads"):  # divided below, before DraftConfig checks the rest
        field_of(base, key, int, where=where, error=CheckpointError, positive=True)
    raw = {k: config.get(k, base.get(k, False)) for k in NormFlags.__dataclass_fields__}
    flags = {k: field_of(raw, k, bool, where=where, error=CheckpointError) for k in raw}  # "false" is not False
    if layout.norm_output_is_final_norm:
        if not config.get("norm_output", True):
            raise CheckpointError(
                "SpecForge norm_output: false means no final norm before lm_head",
                expected="norm_output true or absent (SpecForge's default)",
                found="false",
                fix="eaglewire drafts always apply the final norm; an SGLang export's "
                "norm_output: false means something else: import it with --format sglang",
            )
        flags["norm_output"] = False  # SpecForge always feeds the pre-norm state to the next step
    try:
        return DraftConfig(
            hidden_size=base["hidden_size"],
            intermediate_size=base["intermediate_size"],
            num_attention_heads=base["num_attention_heads"],
            num_key_value_heads=base.get("num_key_value_heads", base["num_attention_heads"]),
            head_dim=base.get("head_dim") or base["hidden_size"] // base["num_attention_heads"],
            target_hidden_size=config.get("target_hidden_size") or base["hidden_size"],
            num_taps=num_taps,
            vocab_size=base["vocab_size"],
            draft_vocab_size=config["draft_vocab_size"],
            num_layers=base.get("num_hidden_layers", 1),
            rms_norm_eps=base["rms_norm_eps"],
            rope_theta=_rope_theta(base),
            max_position_embeddings=base.get("max_position_embeddings", 2048),
            norm=NormFlags(**flags),
        )
    except KeyError as err:
        raise CheckpointError(
            f"{layout.name} config lacks a required field",
            expected=str(err),
            found="missing",
            fix="the directory is not an export of this format",
        ) from None
