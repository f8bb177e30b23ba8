"""What the weights show without running anything: non-finite values, parts that look never trained.

Read tensor by tensor (a draft is small next to its target). A NaN or Inf anywhere poisons every draft
token (the engine loads it without a word); a norm of zeros erases its input; an lm_head equal to the
target's own rows is a head that was copied, not trained (EAGLE-3 trains its reduced-vocab head).

Never-trained parts are recognised by their init's fingerprint, which training erases: PyTorch's default
Linear init is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) — no value outside the bound and the kurtosis of a
uniform, 1.8 — and HF's `initializer_range` init is N(0, 0.02) — std 0.02 to a fraction of a percent and
kurtosis 3. The released draft's trained matrices have 11-69% of their values outside the uniform bound,
kurtosis 3.1-5.4 and stds 1.1-4.8x the uniform's; norms at exactly 1.0 everywhere were never moved.

Engines run the draft in the serving dtype of the target (vLLM builds the draft's model config with the
target's dtype; SGLang loads it with the server's --dtype): a float16 server turns |w| > 65504 into Inf.
"""

from __future__ import annotations


import torch

from eaglewire.capture.boundary_file import loaded
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.export.base import WEIGHTS
from eaglewire.safeio import open_safetensors
from eaglewire.target.protocol import RunnableTarget, TargetInfo


def weight_findings(ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    path = ins.directory / WEIGHTS
    if not path.is_file():
        return []
    out: list[Finding] = []
    with open_safetensors(path, what="draft weights") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if t.is_floating_point():
                out += _tensor_findings(k, t, ins, target)
    return out


def _tensor_findings(k: str, t: torch.Tensor, ins: Inspection, target: TargetInfo | None) -> list[Finding]:
    """One float tensor's findings: the first of non-finite, all zeros, a copied head or an init still in place
    (each hides the next), then values float16 cannot hold (only where all are finite)."""
    bad = int((~torch.isfinite(t)).sum())
    first = _non_finite(k, bad) if bad else _untrained(k, t, ins, target)
    out = [first] if first is not None else []
    if bad == 0 and float(t.float().abs().max()) > FP16_MAX:
        out.append(_beyond_fp16(k, float(t.float().abs().max())))
    return out


def _non_finite(k: str, bad: int) -> Finding:
    return Finding(
        "error",
        "weights",
        f"{k} holds {bad} NaN/Inf value(s)",
        "the engine loads them silently: every drafted token is garbage",
        "re-export from a healthy checkpoint (training diverged or the file is damaged)",
    )


def _untrained(k: str, t: torch.Tensor, ins: Inspection, target: TargetInfo | None) -> Finding | None:
    """A finite tensor that was never trained: all zeros, the target's own head rows, or its init's statistics."""
    if t.numel() and not bool(t.abs().gt(0).any()):
        return _all_zeros(k)
    if k == "lm_head.weight" and loaded(target) and _copied_head(t, ins, target):
        return Finding(
            "warn",
            "weights",
            "lm_head equals the target's lm_head rows bit for bit",
            "a copied head, not a trained one: acceptance is that of the target's head on the draft's state",
            "train the draft head (eaglewire train)",
        )
    if (init := at_init(k, t)) is not None:
        return Finding(
            "warn",
            "weights",
            f"{k} looks never trained: {init}",
            "training moves every "
            "weight off its init's distribution; this one still has it, so the engine "
            "runs a random part",
            "export from the trained checkpoint (or train it)",
        )
    return None


def _all_zeros(k: str) -> Finding:
    why = (
        "the norm erases its input: the draft sees nothing there"
        if k.endswith("norm.weight")
        else "an embedding of zeros (speculators' save_pretrained writes one for a draft saved without "
        "its embedding) is used as it is: vLLM takes the draft's own embed_tokens when the file "
        "has one"
        if k == "embed_tokens.weight"
        else "a matrix of zeros outputs zeros"
    )
    return Finding(
        "error",
        "weights",
        f"{k} is all zeros",
        why,
        "re-export with the real weight (eaglewire export --with-embedding for the embedding), or drop the tensor"
        if k == "embed_tokens.weight"
        else "re-export; the weight was never trained or set",
    )


def _beyond_fp16(k: str, big: float) -> Finding:
    return Finding(
        "warn",
        "dtype",
        f"{k} holds |w| up to {big:.3g}, beyond float16's {FP16_MAX:g}",
        "engines cast the draft to the target's serving dtype: a float16 server turns these into Inf",
        "serve in bfloat16 or float32",
    )


FP16_MAX = 65504.0
HF_INIT_STD = 0.02  # transformers' default initializer_range


def at_init(name: str, t: torch.Tensor) -> str | None:
    """Which known init `t` still has (module docstring), or None. Matrices only from 4096 values, where
    the statistics are sharp: a true init passes within 4 sigma of sampling error, training leaves it."""
    x = t.float().flatten()
    if name.endswith("norm.weight"):  # exact: no statistics needed
        return "every value is exactly 1.0 (RMSNorm's init)" if bool((x == 1).all()) else None
    if t.dim() != 2 or t.numel() < 4096:
        return None
    std = float(x.std())
    if std == 0:
        return None
    kurt = float((((x - x.mean()) / std) ** 4).mean())
    bound = t.shape[1] ** -0.5
    if float(x.abs().max()) <= bound * 1.001 and kurt < 2.2:
        return f"U(±1/sqrt({t.shape[1]})) (PyTorch's Linear default: max |w| {float(x.abs().max()):.4g}, kurtosis {kurt:.2f})"
    n = x.numel()  # 4-sigma sampling tolerances of a true N(0, 0.02): std 1/sqrt(2n) relative, kurtosis sqrt(24/n)
    if (
        abs(std / HF_INIT_STD - 1) < 4 / (2 * n) ** 0.5
        and abs(kurt - 3) < 4 * (24 / n) ** 0.5
        and abs(float(x.mean())) < 4 * HF_INIT_STD / n**0.5
    ):
        return f"N(0, {HF_INIT_STD}) (transformers' initializer_range: std {std:.5f}, kurtosis {kurt:.2f})"
    return None


def _copied_head(head: torch.Tensor, ins: Inspection, target: RunnableTarget) -> bool:
    d2t = ins.small.get("d2t")
    ref = target.model.get_output_embeddings().weight.detach()  # [V, H]
    if d2t is None or d2t.numel() != head.shape[0] or ref.shape[1] != head.shape[1]:
        return False
    ids = torch.arange(d2t.numel()) + d2t.long()  # [V_d] target ids (out of range: the d2t check's finding)
    if int(ids.min()) < 0 or int(ids.max()) >= ref.shape[0]:
        return False
    rows = ref[ids].to(head.dtype)  # [V_d, H]
    return bool(torch.equal(rows, head))
