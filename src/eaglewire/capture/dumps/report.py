"""What a hidden-state dump holds: `inspect_dump` reads any dump (SpecForge, speculators, our own feature
directories) and reports shapes, dtypes, token counts, loss-mask coverage and non-finite values; with a target
it names the residual-stream boundary of every stored state by comparing a few samples with the target's own
states on the same tokens (the doctor's probe, `capture.identify.identify`, applied to training data).

The founding case it must name: a dump holding [embed, l3, l31] (+ l59) where [l3, l31, l59] was meant —
"the dump's taps are boundaries [0 (embedding), 3, 31]; declared [3, 31, 59] (one boundary early ...)".
Nothing here raises on a damaged sample: unreadable samples become `errors` in the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from eaglewire.contract import default_taps, describe_boundary, from_engine
from eaglewire.capture.dumps.readers import CONVENTION, open_dump
from eaglewire.capture.dumps.sample import POST_NORM, Dump, DumpSample
from eaglewire.capture.identify import boundary_label, identify
from eaglewire.errors import EaglewireError
from eaglewire.target.loader import Target

PROBE_TOKENS = 64  # positions compared per sample (causal: the first 64 states need only the first 64 tokens)


@dataclass
class StoredState:
    name: str  # where it is in the tool's layout, e.g. "aux_hidden_state[:, 1]" or "hidden_states[:, -1]"
    role: str  # "tap" or "last"
    found: int | str | None = None  # identified boundary, "post-norm", or None (unrecognised / no target)
    meaning: str = ""  # the boundary in words


@dataclass
class DumpReport:
    path: str
    format: str
    layout: str
    samples: int = 0  # samples with hidden states
    scanned: int = 0  # samples read for the statistics
    tokens: int = 0
    loss_tokens: int = 0
    hidden_size: int | None = None
    num_taps: int | None = None
    dtypes: dict[str, str] = field(default_factory=dict)
    first_shapes: dict[str, list[int]] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)  # tensor -> NaN/Inf count over scanned samples
    rows_without_states: int = 0
    errors: list[str] = field(default_factory=list)  # unreadable samples (first few), with the reason
    stored: list[StoredState] = field(default_factory=list)
    declared: list[int] | None = None  # boundaries
    found_taps: list[int | str | None] | None = None
    findings: list[str] = field(default_factory=list)
    ok: bool = True

    @property
    def loss_coverage(self) -> float:
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loss_coverage": self.loss_coverage}

    def lines(self) -> list[str]:
        out = [
            f"{self.path}: {self.layout}",
            f"  samples {self.samples} (scanned {self.scanned}), tokens {self.tokens}, "
            f"loss-mask coverage {self.loss_coverage:.1%}, hidden size {self.hidden_size}, taps {self.num_taps}",
            "  dtypes " + ", ".join(f"{k} {v}" for k, v in self.dtypes.items()),
        ]
        if self.rows_without_states:
            out.append(f"  {self.rows_without_states} dataset rows have no hidden-state file")
        out += [
            f"  {s.name}: "
            + (f"{boundary_label(s.found)} — {s.meaning}" if s.meaning else "not identified (pass a target)")
            for s in self.stored
        ]
        out += [f"  ! {f}" for f in self.findings] + [f"  error: {e}" for e in self.errors]
        out.append("  OK" if self.ok else "  NOT OK")
        return out


def declared_boundaries(
    fmt: str, num_layers: int, taps: Sequence[int] | None, taps_from: str | None, stored: int | None = None
) -> tuple[int, ...]:
    """The boundaries a dump is declared to hold: `taps` in convention `taps_from` (default: the format's
    own), or the tools' default. For speculators a trailing id L (the verifier state, which the dump always
    appends) may be listed or not; `stored` (taps found in the dump) tells which."""
    conv = taps_from or CONVENTION[fmt]
    if taps is None:
        return default_taps(num_layers)
    ids = [int(t) for t in taps]
    if fmt == "speculators" and stored is not None and len(ids) == stored + 1 and ids[-1] == num_layers:
        ids = ids[:-1]  # the --include-last-layer id: the dump's last state, not a tap
    return from_engine(ids, conv, num_layers)


def expected_last(dump: Dump, num_layers: int) -> int | str:
    """What the format says its last state is: the final-norm output, or boundary L (pre-norm)."""
    return POST_NORM if dump.last_kind == POST_NORM else num_layers


def identify_sample(target: Target, sample: DumpSample) -> tuple[list[int | str | None], int | str | None]:
    """(boundary of each stored tap, boundary of the last state) on the sample's first PROBE_TOKENS."""
    n = min(PROBE_TOKENS, len(sample.input_ids))
    hidden = torch.cat([sample.taps[:n].flatten(1), sample.last[:n]], -1).float()  # [n, (k+1)*H]
    names = identify(target, hidden, sample.input_ids[:n])
    return names[:-1], names[-1]


def describe_mismatch(
    declared: list[int], found: list[int | str | None], last: int | str, found_last: int | str | None, num_layers: int
) -> str:
    """The finding in words: which boundaries are stored where others were declared, and the usual cause."""
    label = "[" + ", ".join(boundary_label(f) for f in found) + "]"
    parts = []
    if len(found) == 1 and len(declared) > 1:
        parts.append(f"ONE state ({label}) where {len(declared)} taps were expected: aux capture was off")
    elif found != declared:
        msg = f"the dump's taps are boundaries {label}; declared {declared}"
        if all(isinstance(f, int) for f in found) and len(found) == len(declared):
            shift = {d - f for d, f in zip(declared, found)}  # type: ignore[operator]
            if shift == {1}:
                msg += (
                    " (one boundary early: each tap is the INPUT of the declared layer — an off-by-one "
                    "between layer-id conventions"
                    + (", and the embedding was stored as a tap" if 0 in found else "")
                    + ")"
                )
            elif shift == {-1}:
                msg += " (one boundary late: an off-by-one between layer-id conventions)"
        if 0 in found and "embedding" not in msg:
            msg += "; the embedding output (boundary 0) is stored as a tap"
        parts.append(msg)
    if found_last != last:

        def words(b: int | str | None) -> str:
            return (
                "the final-norm output"
                if b == POST_NORM
                else "unrecognised"
                if b is None
                else describe_boundary(int(b), num_layers)
            )

        parts.append(f"the last state is {words(found_last)}, the format says {words(last)}")
    return "; ".join(parts)


def _scan(dump: Dump, rep: DumpReport, limit: int | None) -> DumpSample | None:
    """Statistics over the samples (one in memory at a time); returns the first readable one."""
    first = None
    for sid in dump.ids()[:limit]:
        try:
            s = dump.read(sid)
        except EaglewireError as err:
            rep.errors.append(str(err).replace("\n", " |"))
            continue
        first = first or s
        rep.scanned += 1
        rep.tokens += len(s.input_ids)
        rep.loss_tokens += int((s.loss_mask != 0).sum())
        for name, t in (("taps", s.taps), ("last", s.last)):
            rep.nonfinite[name] = rep.nonfinite.get(name, 0) + int((~torch.isfinite(t.float())).sum())
    rep.errors = rep.errors[:10]
    return first


def _stored_names(dump: Dump, k: int) -> list[tuple[str, str]]:
    if dump.format == "specforge":
        return [(f"aux_hidden_state[:, {i}]", "tap") for i in range(k)] + [("hidden_state", "last")]
    if dump.format == "speculators":
        return [(f"hidden_states[:, {i}]", "tap") for i in range(k)] + [(f"hidden_states[:, {k}] (last)", "last")]
    return [(f"taps[:, {i}]", "tap") for i in range(k)] + [("final_hidden", "last")]


def _identify(dump: Dump, rep: DumpReport, target: Target, samples: int) -> None:
    """Name every stored state from `samples` samples; disagreeing samples are a finding of their own."""
    results = []
    for sid in dump.ids()[:samples]:
        try:
            results.append(identify_sample(target, dump.read(sid)))
        except EaglewireError:
            continue  # already in rep.errors
    if not results:
        return
    if any(r != results[0] for r in results):
        rep.findings.append(f"samples disagree on what they hold: {results}")
    found_taps, found_last = results[0]
    rep.found_taps = found_taps
    L = target.num_layers
    for s, b in zip(rep.stored, [*found_taps, found_last]):
        s.found = b
        s.meaning = (
            "the final-norm output (LM-head input)"
            if b == POST_NORM
            else "matches no boundary of this target"
            if b is None
            else describe_boundary(int(b), L)
        )
    last = expected_last(dump, L)
    if rep.declared is not None and (found_taps != rep.declared or found_last != last):
        rep.findings.append(describe_mismatch(rep.declared, found_taps, last, found_last, L))
    elif rep.declared is None and 0 in found_taps:
        rep.findings.append("the embedding output (boundary 0) is stored as a tap")


def inspect_dump(
    src: Path,
    fmt: str = "auto",
    target: Target | None = None,
    declared_taps: Sequence[int] | None = None,
    taps_from: str | None = None,
    *,
    limit: int | None = None,
    probe_samples: int = 2,
    states_dir: Path | None = None,
) -> DumpReport:
    """Report what the dump at `src` holds. `declared_taps` are layer ids in `taps_from` (default: the
    format's own convention); our feature dirs declare their contract's taps themselves. `limit` caps the
    samples scanned for statistics (None: all); `probe_samples` are compared with the target; `states_dir`
    as in import_dump."""
    dump = open_dump(Path(src), fmt, states_dir)
    rep = DumpReport(
        str(src), dump.format, dump.layout(), samples=len(dump.ids()), rows_without_states=dump.missing_rows
    )
    first = _scan(dump, rep, limit)
    if first is None:
        rep.ok = False
        rep.findings.append("no readable sample")
        return rep
    k, H = first.taps.shape[1:]
    rep.num_taps, rep.hidden_size = k, H
    rep.dtypes = {n: str(t.dtype).removeprefix("torch.") for n, t in first.tensors().items()}
    rep.first_shapes = {n: list(t.shape) for n, t in first.tensors().items()}
    rep.stored = [StoredState(n, r) for n, r in _stored_names(dump, k)]
    if any(rep.nonfinite.values()):
        rep.findings.append("non-finite values: " + ", ".join(f"{v} in {n}" for n, v in rep.nonfinite.items() if v))
    if k == 1:
        rep.findings.append("ONE tap state stored: EAGLE-3 expects three (aux capture off?)")
    if target is not None:
        if H != target.hidden_size:
            rep.findings.append(f"states are {H} wide, the target's hidden size is {target.hidden_size}")
        else:
            if declared_taps is not None:
                rep.declared = list(
                    declared_boundaries(
                        dump.format, target.num_layers, declared_taps, taps_from or CONVENTION[dump.format], stored=k
                    )
                )
            elif dump.declared_taps is not None:
                rep.declared = list(dump.declared_taps)
            _identify(dump, rep, target, probe_samples)
    rep.ok = not rep.findings and not rep.errors
    return rep
