"""Import a SpecForge or speculators hidden-state dump into eaglewire feature shards.

The shards are the ones `capture_features` writes (same files, keys, manifest and resume rules, through
`write_feature_dir`), so training cannot tell an imported directory from a captured one. What differs is
only where the states come from, and two things the tools store differently:

- taps: the tool's layer ids are translated to our boundaries by `contract.from_engine` (the one place that
  knows each convention's off-by-one); by default the tool's own default ids, which both tools set to the
  boundaries `default_taps(L)` = [2, L//2, L-3] (SpecForge `[1, L//2-1, L-4]` in SGLang numbering,
  scripts/prepare_hidden_states.py; speculators `[2, L//2, L-3]`, speculators/models/utils.py).
- the last-layer state: our `final_hidden` is the target's final-NORM output. SpecForge's `hidden_state` is
  already that (stored as is); speculators' last state is the last layer BEFORE the norm, so the target's
  own final norm is applied to it here (as speculators' trainer applies its frozen `verifier_norm`).
  `target_top1` is computed from the target's LM head on that state, in the target's dtype (our format
  stores it; neither tool does).

Before anything is written, `verify` samples are compared with the target's own states on the same tokens
(the doctor's probe): a dump holding other boundaries than declared, or the other side of the final norm, is
refused with what it holds. A sample that cannot be read is refused naming its file; shards before it stay
whole on disk (resumable), the one being built is never written, and the manifest only comes at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch

from eaglewire.contract import to_engine
from eaglewire.capture.dumps.readers import CONVENTION, open_dump
from eaglewire.capture.dumps.sample import POST_NORM, PRE_NORM, Dump, DumpSample
from eaglewire.capture.dumps.report import declared_boundaries, describe_mismatch, expected_last, identify_sample
from eaglewire.capture.feature_dir import write_feature_dir
from eaglewire.capture.features import DEFAULT_STORE_DTYPE, features_view, pack_rows, target_top1
from eaglewire.errors import ContractMismatch, EaglewireError, TranslationError
from eaglewire.target.loader import Target


def verify_sample(target: Target, sample: DumpSample, taps: tuple[int, ...], last: int | str) -> str | None:
    """None if the sample's stored states are the target's boundaries `taps` (and `last`), else why not."""
    found_taps, found_last = identify_sample(target, sample)
    if list(found_taps) == list(taps) and found_last == last:
        return None
    return describe_mismatch(list(taps), found_taps, last, found_last, target.num_layers)


def _row(target: Target, head: torch.Tensor, sample: DumpSample, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    tdtype = head.dtype
    last = sample.last.to(tdtype)  # [T, H]
    if sample.last_kind == PRE_NORM:
        with torch.no_grad():
            last = target.final_norm(last)  # speculators' last layer is pre-norm: reach the head's input
    bad = {n: int((~torch.isfinite(t.float())).sum()) for n, t in (("taps", sample.taps), ("last state", last))}
    if any(bad.values()):
        raise EaglewireError(
            f"{sample.path}: non-finite hidden states",
            expected="finite values",
            found=", ".join(f"{v} NaN/Inf in {k}" for k, v in bad.items() if v),
            fix="re-create this sample (both tools skip NaN samples when they write)",
        )
    return {
        "input_ids": sample.input_ids,
        "loss_mask": sample.loss_mask,
        "taps": sample.taps.flatten(1).to(dtype),  # [T, k*H] in stored (ascending) order
        "final_hidden": last.to(dtype),
        "target_top1": target_top1(head, last),
    }


def _check_layout(dump: Dump, first: DumpSample, target: Target, taps: tuple[int, ...]) -> None:
    k, H = first.taps.shape[1], first.taps.shape[2]
    if H != target.hidden_size:
        raise ContractMismatch(
            f"{first.path}: states of another width than the target's hidden size",
            expected=f"H = {target.hidden_size} ({target.name})",
            found=f"H = {H}",
            fix="import with the target the dump was made from",
        )
    if k != len(taps):
        what = (
            f"ONE state where {len(taps)} taps were expected: aux capture was off"
            if k == 1
            else f"{k} stored taps, {len(taps)} declared"
        )
        raise ContractMismatch(
            f"{first.path}: {what}",
            expected=f"{len(taps)} taps (boundaries {list(taps)})",
            found=f"{k} H-wide states in {dump.layout()}",
            fix="pass --taps with the layer ids the dump was captured with, or re-capture",
        )


def _verify(dump: Dump, ids: list[str], first: DumpSample, target: Target, bounds: tuple[int, ...]) -> None:
    """Refuse the dump unless these samples hold the declared taps and the format's last state."""
    last = expected_last(dump, target.num_layers)
    for sid in ids:
        sample = first if sid == first.id else dump.read(sid)
        why = verify_sample(target, sample, bounds, last)
        if why:
            try:
                also = f" ({dump.format} ids {list(to_engine(bounds, CONVENTION[dump.format], target.num_layers))})"
            except TranslationError:  # declared in another convention, inexpressible in the tool's own
                also = ""
            raise ContractMismatch(
                f"{sample.path}: the dump does not hold what was declared",
                expected=f"taps {list(bounds)}{also}",
                found=why,
                fix="inspect it (inspect_dump / eaglewire data inspect) and pass the taps "
                "it really holds, or re-capture it",
            )


def _open_samples(src: Path, fmt: str, states_dir: Path | None) -> tuple[Dump, list[str]]:
    """The dump at `src` and its sample ids; refused when it is our own feature directory or holds no sample."""
    dump = open_dump(Path(src), fmt, states_dir)
    if dump.format == "eaglewire":
        raise EaglewireError(
            f"{src} is already an eaglewire feature directory",
            expected="a tool's dump",
            found="manifest.json",
            fix="use it directly (train --features DIR)",
        )
    ids = dump.ids()
    if not ids:
        raise EaglewireError(f"{src}: the dump has no samples with hidden states", expected="at least one", found="0")
    return dump, ids


def _source(dump: Dump, src: Path, taps_from: str | None, verified: int) -> dict:
    """The manifest's `source`: which dump the shards were imported from, and how its states were read."""
    return {
        "format": dump.format,
        "path": str(Path(src).resolve()),
        "layout": dump.layout(),
        "taps_from": taps_from or CONVENTION[dump.format],
        "verified_samples": verified,
        "last_state": "stored post-norm" if dump.last_kind == POST_NORM else "pre-norm + target final norm",
        "rows_without_states": dump.missing_rows,
    }


def import_dump(
    src: Path,
    fmt: str,
    target: Target,
    out: Path,
    *,
    taps: Sequence[int] | None = None,
    taps_from: str | None = None,
    shard_samples: int = 256,
    dtype: torch.dtype = DEFAULT_STORE_DTYPE,
    verify: int = 2,
    on_shard: Callable[[int, int, int], None] | None = None,
    states_dir: Path | None = None,
) -> dict:
    """Convert (or resume converting) the dump at `src` into feature shards in `out`; returns the manifest.

    fmt: "specforge", "speculators" or "auto". taps: the layer ids the tool was configured with, in
    convention `taps_from` (default: the format's own, see contract.CONVENTIONS; SpecForge 0.2.0 captures
    through SGLang, so "sglang" may be the right reading of its ids when the first tap is not boundary 2).
    verify: how many samples to check against the target's own forward before writing (0 skips it, for a
    target too large to run here; the manifest records how many were checked). states_dir: speculators'
    hs_*.safetensors when they are not under `src`/hidden_states (its generate step's --output)."""
    dump, ids = _open_samples(src, fmt, states_dir)
    first = dump.read(ids[0])
    bounds = declared_boundaries(dump.format, target.num_layers, taps, taps_from, stored=first.taps.shape[1])
    _check_layout(dump, first, target, bounds)
    _verify(dump, ids[:verify], first, target, bounds)
    contract = target.contract(bounds)
    head = target.model.get_output_embeddings().weight.detach()  # [V, H]
    sids = {f"{dump.format}:{sid}": sid for sid in ids}  # feature sample id -> the dump's own id

    def build(_k: int, chunk: list[str]) -> dict[str, torch.Tensor]:
        return pack_rows([_row(target, head, dump.read(sids[c]), dtype) for c in chunk])

    return write_feature_dir(
        Path(out),
        features_view(contract),
        list(sids),
        build,
        shard_samples=shard_samples,
        target_dtype=str(first.taps.dtype).removeprefix("torch."),
        store_dtype=dtype,
        on_shard=on_shard,
        extra={"source": _source(dump, src, taps_from, min(verify, len(ids)))},
    )
