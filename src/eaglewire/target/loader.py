"""Targets: the embedded default (SmolLM2-135M-Instruct from a GGUF in a PyPI wheel: embedded.py) or any local
HF dir.

`load_target` returns a `Target`: the HF model plus the handles eaglewire needs from it (decoder-layer
list, final norm, input embedding) located structurally, so one code path serves every HF decoder,
including language models nested inside multimodal wrappers.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eaglewire.contract import TargetIdentity, WiringContract
from eaglewire.records import canonical_json, sha256_text
from eaglewire.norms import NormFlags
from eaglewire.errors import TargetError
from eaglewire.paths import check_path, resolve_path
from eaglewire.safeio import read_json_object
from eaglewire.target.embedded import DEFAULT_TARGET, EMBEDDED, embedded_target_dir

log = logging.getLogger(__name__)

# Config keys that describe how a model was loaded or saved, not what it computes.
_VOLATILE_CONFIG_KEYS = {
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_experts_implementation",
    "use_cache",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "architectures",
    "_commit_hash",
    "quantization_config",
}
_FINAL_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm", "norm_f")


@dataclass
class Target:
    """A loaded target and the structural handles capture and drafting need."""

    name: str
    model: nn.Module
    tokenizer: Any | None
    layers_path: str  # dotted module path of the decoder-layer ModuleList
    layers: nn.ModuleList
    final_norm: nn.Module
    embed_tokens: nn.Embedding
    path: Path | None = None

    @property
    def text_config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.vocab_size)

    @property
    def device(self) -> torch.device:
        """Where the target's inputs go: its input embedding's device (a target spread over several GPUs runs
        its first layers there; transformers' hooks move activations between its parts)."""
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the target computes in (that of its parameters)."""
        return next(self.model.parameters()).dtype

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if self.tokenizer is not None else None

    @property
    def chat_template_sha256(self) -> str | None:
        return sha256_text(self.chat_template)

    @property
    def pad_id(self) -> int:
        """The id batches are padded with: the tokenizer's pad token, else EOS (many chat models lack one)."""
        tok = self.tokenizer
        if tok is None:
            raise TargetError(
                f"target {self.name!r} has no tokenizer to pad with",
                expected="a tokenizer",
                found="none (a target built in-process)",
                fix="load the target from a directory",
            )
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    @property
    def identity(self) -> TargetIdentity:
        arch = (getattr(self.model.config, "architectures", None) or [type(self.model).__name__])[0]
        return TargetIdentity(
            name=self.name,
            architecture=arch,
            config_sha256=config_sha256(self.text_config),
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            vocab_size=self.vocab_size,
        )

    def contract(
        self, taps: tuple[int, ...], *, norm: NormFlags | None = None, vocab_map: Any | None = None
    ) -> WiringContract:
        """A wiring contract for this target (vocab_map: an eaglewire.draft.vocab.VocabMap, once built)."""
        return WiringContract.for_target(
            self.identity, taps, norm=norm, vocab_map=vocab_map, chat_template_sha256=self.chat_template_sha256
        )

    # ---- the tensors a draft is built from (TargetWeights reads the same ones from the weight files) ----
    def embedding(self) -> torch.Tensor:
        """[V, H] the input embedding (the draft shares it, frozen)."""
        return self.embed_tokens.weight

    def head_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """[len(ids), H] the output head's rows for target ids `ids` (all V rows when None)."""
        head: torch.Tensor = self.model.get_output_embeddings().weight
        return head if ids is None else head[ids]

    def final_norm_weight(self) -> torch.Tensor | None:
        """[H] the final norm's scale (None where the norm has none)."""
        return getattr(self.final_norm, "weight", None)

    def layer_parameters(self, index: int) -> dict[str, torch.Tensor]:
        """Decoder layer `index`'s parameters by their name inside the layer (e.g. self_attn.q_proj.weight)."""
        return dict(self.layers[index].named_parameters())

    def info(self) -> dict[str, Any]:
        ident = self.identity
        tied = bool(
            getattr(self.model.config, "tie_word_embeddings", False)
            or getattr(self.text_config, "tie_word_embeddings", False)
        )
        return {
            "name": self.name,
            "path": str(self.path) if self.path else None,
            "architecture": ident.architecture,
            "model_type": self.text_config.model_type,
            "num_layers": ident.num_layers,
            "hidden_size": ident.hidden_size,
            "vocab_size": ident.vocab_size,
            "dtype": str(self.dtype).removeprefix("torch."),
            "tie_word_embeddings": tied,
            "has_chat_template": self.chat_template is not None,
            "chat_template_sha256": sha256_text(self.chat_template),
            "decoder_layers": self.layers_path,
            "config_sha256": ident.config_sha256,
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }


def config_sha256(config: Any) -> str:
    """Hash of what the config computes (load/save bookkeeping keys removed)."""
    d = {k: v for k, v in config.to_dict().items() if k not in _VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(canonical_json(d).encode()).hexdigest()


# --------------------------------------------------------------------------------------------------
# Locating the decoder stack
# --------------------------------------------------------------------------------------------------


def find_decoder_stack(model: nn.Module) -> tuple[str, nn.ModuleList, nn.Module, nn.Embedding]:
    """Find (path, layers, final_norm, embedding) of the text decoder, however deeply it is nested.

    The decoder-layer list is the nn.ModuleList of `text_config.num_hidden_layers` same-class modules
    whose parent also owns an nn.Embedding of `vocab_size` rows; a vision tower's block list fails the
    embedding test, so multimodal wrappers resolve without per-architecture code.
    """
    cfg = model.config.get_text_config()
    n_layers, vocab = int(cfg.num_hidden_layers), int(cfg.vocab_size)
    modules = dict(model.named_modules())
    found = []
    for name, mod in modules.items():
        if not isinstance(mod, nn.ModuleList) or len(mod) != n_layers:
            continue
        if len({type(m) for m in mod}) != 1:
            continue
        parent = modules[name.rsplit(".", 1)[0]] if "." in name else model
        embeds = [m for m in parent.children() if isinstance(m, nn.Embedding) and m.num_embeddings == vocab]
        if embeds:
            found.append((name, mod, parent, embeds[0]))
    looked_for = (
        f"an nn.ModuleList of {n_layers} identical decoder layers (text_config.num_hidden_layers) "
        f"whose parent module also holds an nn.Embedding with {vocab} rows (vocab_size)"
    )
    if len(found) != 1:
        raise TargetError(
            f"cannot locate the decoder layers of {type(model).__name__}",
            expected=looked_for,
            found=f"{len(found)} candidates: {[f[0] for f in found]}",
            fix="this architecture is not supported yet; please file an issue with its module tree",
        )
    name, layers, parent, embed = found[0]
    norms = [getattr(parent, n) for n in _FINAL_NORM_NAMES if isinstance(getattr(parent, n, None), nn.Module)]
    if not norms:
        raise TargetError(
            f"cannot locate the final norm next to {name}",
            expected=f"a submodule named one of {list(_FINAL_NORM_NAMES)} beside the decoder layers",
            found=f"children {[n for n, _ in parent.named_children()]}",
        )
    return name, layers, norms[0], embed


def wrap_model(model: nn.Module, name: str, tokenizer: Any | None = None, path: Path | None = None) -> Target:
    """Make a Target from an already-built HF model (tests build tiny random ones in-process)."""
    model.eval()
    layers_path, layers, norm, embed = find_decoder_stack(model)
    return Target(
        name=name,
        model=model,
        tokenizer=tokenizer,
        layers_path=layers_path,
        layers=layers,
        final_norm=norm,
        embed_tokens=embed,
        path=path,
    )


# --------------------------------------------------------------------------------------------------
# Resolving and loading
# --------------------------------------------------------------------------------------------------


def resolve_target(spec: str | None) -> tuple[str, Path]:
    """`None`/an embedded name -> its cached float checkpoint; anything else must be a local HF dir."""
    if spec is None or spec in EMBEDDED:
        name = spec or DEFAULT_TARGET
        return EMBEDDED[name].display, embedded_target_dir(name)
    path = check_path(Path(spec).expanduser(), "target")
    if not path.exists():
        raise TargetError(
            f"target {spec!r} does not exist",
            expected=f"a local HF model directory or one of {sorted(EMBEDDED)}",
            found="no such file or directory",
            fix="check the path (no hub downloads here)",
        )
    if not path.is_dir() or not (path / "config.json").is_file():
        raise TargetError(
            f"target {spec!r} is not a HF model directory",
            expected="a directory with config.json and weights (*.safetensors or *.bin)",
            found=f"{'a file' if path.is_file() else 'a directory without config.json'}",
            fix="point at the model's directory (save_pretrained writes config.json into it)",
        )
    real = resolve_path(path, "target")
    return real.name, real


def read_target_config(path: Path, bytes_per: int = 4) -> dict[str, Any]:
    """config.json of HF directory `path`, its sizes and physics checked (eaglewire.limits) before transformers
    builds anything from it: a damaged size is an error naming the field, not an allocation."""
    from eaglewire.limits import check_config_values, check_weight_bytes, estimated_params

    where = f"target config {path / 'config.json'}"
    cfg = read_json_object(path / "config.json", what="a target config", error=TargetError)
    check_config_values(cfg, where, TargetError)
    check_weight_bytes(estimated_params(cfg), bytes_per, where, TargetError)
    return cfg


def placement(device: str, weight_bytes: int) -> dict[str, Any]:
    """from_pretrained's keyword for putting a target of `weight_bytes` on `device` (hw.pick_device's choice):
    nothing on the CPU; the whole model on the one GPU named where it fits in that GPU's free memory (or
    only one GPU is visible: then CUDA's own out-of-memory error says so); else `device_map="auto"`, the
    layers spread over every visible GPU (accelerate's dispatch), for a target too large for one."""
    if not device.startswith("cuda"):
        return {} if device == "cpu" else {"device_map": {"": device}}
    index = int(device.partition(":")[2] or torch.cuda.current_device())
    free, _total = torch.cuda.mem_get_info(index)
    # 0.85: the KV cache, activations and (when training) the draft need the rest
    if torch.cuda.device_count() == 1 or weight_bytes < 0.85 * free:
        return {"device_map": {"": f"cuda:{index}"}}
    log.info(
        "target of %.1f GB > one GPU's free %.1f GB: spread over %d GPUs (device_map='auto')",
        weight_bytes / 1e9,
        free / 1e9,
        torch.cuda.device_count(),
    )
    return {"device_map": "auto"}


def load_target(
    spec: str | None = None, *, dtype: torch.dtype = torch.float32, with_tokenizer: bool = True, device: str = "cpu"
) -> Target:
    """Load a target for capture/drafting on `device` (hw.pick_device decides it; placement). fp32 by default:
    bf16 pays only where the CPU has it natively (hw.native_bf16; `eaglewire.hw.runtime_dtype` makes that
    choice for the decoding commands) — on a GPU the callers pass bf16 (hw.default_dtype_name)."""
    from transformers import AutoModelForCausalLM

    from eaglewire.limits import estimated_params

    name, path = resolve_target(spec)
    cfg = read_target_config(path, bytes_per=dtype.itemsize)
    where = placement(device, estimated_params(cfg) * dtype.itemsize)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **where)
    except torch.serialization.pickle.UnpicklingError:  # type: ignore[attr-defined]  # (torch re-exports the stdlib's; src never imports pickle)
        # transformers unpickles .bin weights with weights_only=True; its message then suggests turning that
        # off, which would run whatever the file names: that advice is not passed on
        raise TargetError(
            f"target {str(path)!r} has pickled weights that are not plain tensors",
            expected="weights as safetensors (or a .bin that weights_only unpickling accepts)",
            found="a .bin whose pickle names other objects: refused, nothing in it was run",
            fix="get the model's safetensors weights from a source you trust; do not unpickle "
            "this file with weights_only turned off (that runs what it names)",
        ) from None
    except Exception as err:  # any failure of transformers on an untrusted config is this error
        raise TargetError(
            f"transformers cannot load target {str(path)!r} as a causal LM",
            expected="a checkpoint AutoModelForCausalLM can load",
            found=f"model_type={cfg.get('model_type')!r}: {type(err).__name__}: {str(err)[:300]}",
        ) from None
    return wrap_model(model, name, load_tokenizer(path) if with_tokenizer else None, path)


def load_tokenizer(path: Path) -> Any | None:
    """The tokenizer saved in HF dir `path` (its chat template and padding id), None where it has none."""
    from transformers import AutoTokenizer

    has_tok = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    return AutoTokenizer.from_pretrained(path) if has_tok else None
