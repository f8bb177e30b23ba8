"""DraftConfig: the architecture of an EAGLE-3 draft (Llama-style layers), derived from its target."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from eaglewire.contract import WiringContract
from eaglewire.norms import NormFlags
from eaglewire.errors import CheckpointError
from eaglewire.limits import check_config_values, check_weight_bytes
from eaglewire.safeio import check_dataclass_fields


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int  # width of ONE tap; fc reads num_taps * target_hidden_size
    num_taps: int
    vocab_size: int  # target vocabulary (the embedding's rows, t2d's length)
    draft_vocab_size: int  # lm_head rows, d2t's length
    num_layers: int = 1  # layer 0 reads [embed ; hidden] (2H); layers >= 1 are plain decoder layers
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    norm: NormFlags = field(default_factory=NormFlags)

    # sizes a layer is built from: zero or negative ones make no model (and 0 heads divided by zero)
    POSITIVE_FIELDS = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "target_hidden_size",
        "num_taps",
        "vocab_size",
        "draft_vocab_size",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
    )

    def __post_init__(self) -> None:
        floats = ("rms_norm_eps", "rope_theta")
        bad = [
            f"{k}={v!r}"
            for k in self.POSITIVE_FIELDS + ("num_layers",)
            if isinstance(v := getattr(self, k), bool)
            or not isinstance(v, (int, float) if k in floats else int)
            or not v > 0
        ]
        if bad:
            raise CheckpointError(
                "a draft config with sizes that build no model",
                expected="every size a positive int (eps, rope_theta: > 0)",
                found=", ".join(bad),
                fix="re-create the config; it is damaged or hand-edited",
            )
        check_config_values(
            {k: getattr(self, k) for k in self.POSITIVE_FIELDS + ("num_layers",)}, "draft config", CheckpointError
        )
        h, v = self.hidden_size, self.vocab_size + self.draft_vocab_size
        check_weight_bytes(
            v * h
            + self.num_taps * self.target_hidden_size * h
            + self.num_layers * (4 * h * h + 3 * h * self.intermediate_size),
            4,
            "draft config",
            CheckpointError,
        )
        if self.num_layers < 1:
            raise CheckpointError("a draft needs at least one layer", expected=">= 1", found=str(self.num_layers))
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                "num_attention_heads must be a multiple of num_key_value_heads",
                expected="heads % kv_heads == 0",
                found=f"{self.num_attention_heads} % {self.num_key_value_heads}",
            )

    @property
    def fc_in_features(self) -> int:
        return self.num_taps * self.target_hidden_size

    @classmethod
    def from_target(cls, text_config: Any, contract: WiringContract, *, num_layers: int = 1) -> "DraftConfig":
        """Copy the target's Llama-compatible shape (hidden, heads, MLP width, RoPE base, eps).

        The draft keeps the target's hidden size because it shares the target's frozen embedding.
        Only default (unscaled) RoPE is used by the draft; its base is the target's rope_theta.
        """
        if contract.draft_vocab_size is None:
            raise CheckpointError(
                "the contract has no draft vocab size yet",
                expected="a built vocab map",
                found="draft_vocab_size=None",
                fix="build the vocab map first",
            )
        hidden = int(text_config.hidden_size)
        heads = int(text_config.num_attention_heads)
        kv_heads = int(getattr(text_config, "num_key_value_heads", None) or heads)
        rope = getattr(text_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        theta = theta or getattr(text_config, "rope_theta", None) or 10000.0
        head_dim = getattr(text_config, "head_dim", None) or hidden // heads
        if getattr(text_config, "model_type", "") in ("deepseek_v3", "deepseek_v2"):
            head_dim = hidden // heads  # MLA head dims do not describe a standard attention layer
        return cls(
            hidden_size=hidden,
            intermediate_size=int(text_config.intermediate_size),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=int(head_dim),
            target_hidden_size=contract.target.hidden_size,
            num_taps=contract.num_taps,
            vocab_size=contract.target.vocab_size,
            draft_vocab_size=contract.draft_vocab_size,
            num_layers=num_layers,
            rms_norm_eps=float(getattr(text_config, "rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(getattr(text_config, "max_position_embeddings", 2048)),
            norm=contract.norm,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DraftConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in data)
        if unknown or missing:
            raise CheckpointError(
                "draft config has the wrong fields",
                expected=f"fields {sorted(names)}",
                found=f"unknown {unknown}, missing {missing}",
            )
        check_dataclass_fields(data, cls, where="draft config", error=CheckpointError)
        data = dict(data)
        check_dataclass_fields(data["norm"], NormFlags, where="draft config norm", error=CheckpointError)
        if set(data["norm"]) - {f.name for f in dataclasses.fields(NormFlags)}:
            raise CheckpointError(
                "draft config norm has unknown fields",
                expected=str([f.name for f in dataclasses.fields(NormFlags)]),
                found=str(sorted(data["norm"])),
            )
        data["norm"] = NormFlags(**data["norm"])
        return cls(**data)

    def require_matches(self, contract: WiringContract, where: str | None = None) -> None:
        """The architecture must be the one the contract describes (fc width, vocab sizes, norm flags); `where`
        names the files both came from in the error."""
        pairs = [
            ("target_hidden_size", self.target_hidden_size, contract.target.hidden_size),
            ("num_taps", self.num_taps, contract.num_taps),
            ("vocab_size", self.vocab_size, contract.target.vocab_size),
            ("draft_vocab_size", self.draft_vocab_size, contract.draft_vocab_size),
            ("norm", self.norm, contract.norm),
        ]
        for name, mine, theirs in pairs:
            if mine != theirs:
                raise CheckpointError(
                    (f"{where}: " if where else "") + f"draft config field {name!r} disagrees with the wiring contract",
                    expected=f"{name}={theirs!r} (contract)",
                    found=f"{name}={mine!r} (config)",
                    fix="one of the two files was edited after it was written: export again "
                    "from the native draft, or restore the files from a copy",
                )
