"""Measured wiring for block drafters (DFlash): which boundaries a draft's own weights predict best from.

The question, the statistics and the rule are EAGLE-3's (trained_taps.py: `compare`, the paired
block-bootstrap interval, LEVEL, MARGIN, the search); only the score is the block drafter's own. Every
scored position p of the target's greedy text anchors a block [x_p, MASK x (B-1)] that sees the context
taps of positions < p and nothing else (train/block.py's mask through draft/dflash.py's training forward,
so the draft is scored exactly as it was trained); slot k's NLL of the target's token at p+k is one entry,
every drafted slot pooled. A bootstrap block holds neighbouring anchors of one sequence with all their
slots (their entries are not independent). The teacher-forced τ of a round is 1 + the mean run of agreeing
slots over anchors whose every slot is scored (what greedy verification of that block accepts).

Candidates: the config's ids as the engine reads them (delivered; vLLM's eagle_aux_hidden_state_layer_ids
wins over dflash_config.target_layer_ids), the same ids in every other layer-id convention, delivered ±1,
the embedding for the first tap, and z-lab's default formula (what SGLang guesses when ids are missing,
sglang #37475).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from eaglewire.capture.boundaries import Boundaries, sample_target
from eaglewire.capture.boundary_file import DumpTarget, require_finite_rows
from eaglewire.contract import CONVENTIONS, from_engine, misnumbered, to_engine
from eaglewire.decoding.block import block_shape
from eaglewire.decoding.tree import TreeShape
from eaglewire.doctor.block_inspect import LAYOUT_FORMATS, READ_FAMILIES, block_layout as read_block_layout
from eaglewire.doctor.tap_checks import decodes
from eaglewire.doctor.findings import Finding
from eaglewire.doctor.inspect import Inspection
from eaglewire.doctor.measured_tau import EngineRun, knobs, run_engine
from eaglewire.doctor.trained_taps import BLOCK, Measurement, Score, Taps, compare, suspect_adder, wiring_finding
from eaglewire.draft.blocks import block_inputs, block_mask, block_positions
from eaglewire.draft.dflash import DFlashDraft
from eaglewire.draft.vocab import draft_index
from eaglewire.errors import ContractMismatch, EaglewireError
from eaglewire.export.block import FAMILY_OF_ARCH, block_layout
from eaglewire.export.block_import import import_block_backbone
from eaglewire.export.engines import block_fields
from eaglewire.families import EngineField, get_family, zlab_default_ids

CHUNK = 64  # anchors per draft forward: bounds the [Q, S+Q] mask and the [Q, V] logits
OVERRIDES = ("eagle_aux_hidden_state_layer_ids",)  # vLLM reads it first and lets it win (families.py's note)


@dataclass
class BlockPositions:
    """The scored entries: slot k of the block anchored at p predicts the target's label at p+k-1+offset."""

    rows: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]  # (b, anchors [A], per entry:
    # its anchor's index in `anchors` [E], slot [E], label [E])
    blocks: torch.Tensor  # [N] bootstrap block of each entry (all rows' entries in order)
    full: torch.Tensor  # bool [N] the entry's anchor has every drafted slot scored
    drafts: int  # drafted slots per block


def block_entries(bounds: Boundaries, block_size: int, label_offset: int) -> BlockPositions:
    first = 1 - label_offset  # the first drafted slot: 1 ("bonus": slot 0 is the anchor), 0 ("anchor_first")
    drafts, T = block_size - first, bounds.input_ids.shape[1]
    rows, blocks, full = [], [], []
    for b in range(bounds.input_ids.shape[0]):
        scored = bounds.scored[b]  # [T] label t (the target's token after t) counts
        anchors = scored.nonzero().flatten()
        anchors = anchors[anchors >= 1]  # a block needs context; slot `first` reads label p, which is scored
        if not len(anchors):
            continue
        slots = torch.arange(first, block_size)  # [D]
        at = anchors[:, None] + slots[None] - 1 + label_offset  # [A, D] label index of each slot
        ok = (at < T) & scored[at.clamp(max=T - 1)]
        a_idx, s_idx = ok.nonzero(as_tuple=True)
        rows.append((b, anchors, a_idx, slots[s_idx], bounds.labels[b][at[a_idx, s_idx]]))
        blocks.append(b * 10_000 + anchors[a_idx] // BLOCK)
        full.append(ok.all(-1)[a_idx])
    if not rows:
        raise EaglewireError(
            "no position to score a block drafter on",
            expected="scored positions >= 1",
            found="none",
            fix="capture the target's boundaries on longer prompts",
        )
    return BlockPositions(rows, torch.cat(blocks), torch.cat(full), drafts)


@torch.no_grad()
def block_score(draft: DFlashDraft, bounds: Boundaries, pos: BlockPositions, taps: Taps) -> Score:
    """Teacher-forced block NLL of the target's tokens with the context read from boundaries `taps`."""
    Bk, mask_id = draft.block.block_size, draft.block.mask_token_id
    ctx = bounds.taps(taps)  # [B, T, n*H]
    index = draft_index(draft.t2d) if draft.reduced else None  # [V] draft id of each target id, -1 if not kept
    nll, hit = [], []
    for b, anchors, a_idx, slot, label in pos.rows:
        for c0 in range(0, len(anchors), CHUNK):
            a = anchors[None, c0 : c0 + CHUNK]  # [1, A]
            S = int(a.max())  # no query sees context at or after its anchor
            hidden = draft(
                ctx[b : b + 1, :S],
                torch.arange(S)[None],
                block_inputs(bounds.input_ids[b : b + 1], a, Bk, mask_id),
                block_positions(a, Bk),
                block_mask(a, S, Bk),
            )  # [1, A*Bk, H]
            sel = (a_idx >= c0) & (a_idx < c0 + CHUNK)
            logits = draft.logits(hidden[0, (a_idx[sel] - c0) * Bk + slot[sel]]).float()  # [E, V] or [E, V_d]
            want, known = _draft_labels(index, label[sel])  # [E] each
            nll.append(-F.log_softmax(logits, -1).gather(-1, want[:, None])[:, 0] * known)
            hit.append(draft.target_ids(logits.argmax(-1)) == label[sel])
    return Score(taps, torch.cat(nll), torch.cat(hit))


def _draft_labels(index: torch.Tensor | None, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the draft ids of target ids `label` [E], whether the draft vocabulary holds each [E]); `index` the
    reduced vocabulary's draft_index, None for the full one. A token a reduced vocabulary lacks is a miss and adds
    no NLL: the same in every tap hypothesis, so paired comparisons hold."""
    if index is None:
        return label, torch.ones_like(label, dtype=torch.bool)
    idx = index[label]  # [E], -1 where the vocabulary lacks the token
    return idx.clamp_min(0), idx >= 0


def block_tau(score: Score, pos: BlockPositions) -> tuple[float, list[float]]:
    """(1 + mean accepted run per round, acceptance of each slot given the slots before it were accepted)."""
    hits = score.hit[pos.full].view(-1, pos.drafts)  # [A, D] entries of a full anchor are contiguous, by slot
    if not len(hits):
        return 1.0, [0.0] * pos.drafts
    run = hits.long().cumprod(-1)
    alive = torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], -1).sum(0).clamp_min(1)
    return 1.0 + float(run.sum(-1).float().mean()), (run.sum(0) / alive).tolist()


# ---- what the engine delivers, and the suspects ---------------------------------------------------------


def _ints(v: Any) -> list[int] | None:
    ok = isinstance(v, list) and v and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
    return list(v) if ok else None


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def engine_of(config: dict[str, Any], engine: str | None) -> str:
    """The engine whose reading is checked: the one named, if it serves the family, else the layout's own."""
    family = get_family(block_family_of(config))
    return engine if engine in _fields_by_engine(family.name) else block_layout(config)


def _fields_by_engine(family: str) -> dict[str, tuple[EngineField, ...]]:
    """The engine records' fields for `family`'s taps, by the name each row is read under."""
    out: dict[str, tuple[EngineField, ...]] = {}
    for f in block_fields(family):
        out[f.engine] = (*out.get(f.engine, ()), f)
    return out


def block_family_of(config: dict[str, Any]) -> str:
    """The block family a config's architecture names (export/block.py's table; DFlash where none does)."""
    archs = config.get("architectures")
    names = {FAMILY_OF_ARCH[a] for a in archs if a in FAMILY_OF_ARCH} if isinstance(archs, list) else set()
    return names.pop() if len(names) == 1 else "dflash"


def read_ids(config: dict[str, Any], engine: str) -> tuple[list[int] | None, EngineField]:
    """(ids the engine reads, the field it reads them from): its own fields, an override first; a speculators
    config's aux ids (vLLM's updater copies them); the engine's first field where none is set."""
    rows = _fields_by_engine(get_family(block_family_of(config)).name)
    if engine not in rows:
        raise ContractMismatch(
            f"no {engine!r} tap field for this block family", expected=" / ".join(rows), found=engine
        )
    own = sorted(rows[engine], key=lambda f: f.field not in OVERRIDES)
    extra = rows.get("speculators", ()) if "speculators_model_type" in config else ()
    for f in (*own, *extra):
        if (ids := _ints(_get(config, f.field))) is not None:
            return ids, f
    return None, own[-1]


def delivered_block_taps(config: dict[str, Any], engine: str, L: int, n: int) -> tuple[Taps | None, str]:
    ids, f = read_ids(config, engine)
    if ids is None:
        default = from_engine(zlab_default_ids(L, n), "zlab", L)
        return default, f"no {f.field}: the fallback formula (z-lab build_target_layer_ids, sglang #37475)"
    taps = decodes(ids, f.convention, L)
    if taps is None:
        return None, f"{f.field}={ids}, which {engine} cannot capture ({f.convention} convention)"
    if len(taps) != n:
        return None, f"{f.field}={ids}: {len(taps)} taps where the draft's fc reads {n}"
    return taps, f"{f.field}={ids} read by {engine} ({f.note})"


def block_candidates(
    config: dict[str, Any], engine: str, L: int, n: int
) -> tuple[dict[Taps, list[str]], tuple[Taps, ...], Taps | None, str]:
    """(suspects with why, the sets a reading of the config gives, delivered, how it is delivered)."""
    delivered, how = delivered_block_taps(config, engine, L, n)
    ids, f = read_ids(config, engine)
    out: dict[Taps, list[str]] = {}
    add = suspect_adder(out, n, L)

    add(delivered, f"delivered: {how}")
    for conv in CONVENTIONS if ids else ():
        if conv != f.convention:
            add(decodes(ids, conv, L), f"the ids read in the {conv} convention")
    if n <= L - 3:
        add(from_engine(zlab_default_ids(L, n), "zlab", L), "z-lab's default ids (SGLang's guess without ids)")
    priors = tuple(out)
    if delivered is not None:
        late, early = misnumbered(delivered)
        add(late, "delivered +1")
        add(early, "delivered -1")
        add((0, *delivered[1:]), "the embedding substituted for the first tap")
    return out, priors, delivered, how


# ---- the measurement and its finding ----------------------------------------------------------------------


def backbone_for_measure(ins: Inspection, target: Any, n: int) -> DFlashDraft:
    """The draft's DFlash backbone, fp32, read whatever its config's ids say (they are what is under test), in
    the anchor layout of its family (DSpark: slot k predicts p+k+1) with the family's own heads set aside."""
    family, layout = read_block_layout(ins.config) or ("dflash", "zlab")
    record, fmt = READ_FAMILIES[family], LAYOUT_FORMATS.get(layout)
    if record.backbone_heads is None or fmt is None:
        raise EaglewireError(
            f"eaglewire computes no backbone of a {family} draft in the {layout} layout",
            expected="a DFlash or DSpark draft in the z-lab, SGLang or speculators layout",
            found=f"{family}, {layout}",
            fix="measure it where its own trainer runs",
        )
    draft = import_block_backbone(
        ins.directory,
        fmt,
        target=target,
        taps=tuple(range(1, n + 1)),
        anchor_layout=record.anchor_layout(ins.config),
        heads=record.backbone_heads,
    )
    draft = draft.float().cpu()  # scored on the CPU beside the Boundaries; the engine run moves it
    draft.move_attached("cpu")
    return draft


def run_block_measurement(
    ins: Inspection,
    target: Any,
    engine: str | None = None,
    bounds: Boundaries | None = None,
    chain_steps: int = 3,
    shape: TreeShape | None = None,
    progress: Callable[[str], None] = lambda phase: None,
) -> tuple[Measurement | None, list[Finding]]:
    """measured_wiring.run_measurement for a block drafter: (measurement, findings). `chain_steps` is unused
    (the block's own slots are the chain); `shape` (the engine's knobs): our engine also decodes at them with
    the delivered and the best sets (`engine_run`), and the finding gives its tau beside the teacher-forced one."""
    L, H = target.num_layers, target.hidden_size
    fc = ins.shapes.get("fc.weight")
    if fc is None or fc[1] % H:
        return None, [
            Finding(
                "info",
                "measured_wiring",
                "the wiring was not measured: fc does not read whole target states",
                "see the fc finding",
                "fix fc first",
            )
        ]
    n, engine = fc[1] // H, engine_of(ins.config, engine)
    try:
        draft = backbone_for_measure(ins, target, n)
    except EaglewireError as err:
        return None, [
            Finding(
                "warn",
                "measured_wiring",
                f"the wiring was not measured: the draft does not load ({err.what})",
                "the empirical check runs the draft's own weights",
                err.fix or "",
            )
        ]
    reasons, priors, delivered, how = block_candidates(ins.config, engine, L, n)
    if bounds is None and isinstance(target, DumpTarget):
        bounds = target.bounds
    elif bounds is None:
        progress("the target answers the built-in prompts greedily; every boundary is captured (the long phase)")
        bounds = sample_target(target)
    progress(f"scoring {len(reasons)} candidate tap sets by teacher-forced block NLL, then a search around the best")
    m = measure_block(draft, bounds, delivered, reasons, priors, str(ins.directory))
    if shape is not None:
        progress(f"our engine decodes the prompts at {knobs(shape)} with the delivered and the best tap sets")
        m.engine = engine_run(target, draft, shape, m)
    return m, [block_finding(m, ins.config, engine, L, how)]


def measure_block(
    draft: DFlashDraft,
    bounds: Boundaries,
    delivered: Taps | None,
    reasons: dict[Taps, list[str]],
    priors: tuple[Taps, ...] = (),
    where: str = "the draft",
) -> Measurement:
    """trained_taps.measure for a block drafter, whatever file it was read from (a directory's config, a GGUF):
    every labelled candidate scored by teacher-forced block NLL, the search, the rule, and each set's tau."""
    assert draft.embed_weight is not None and draft.head_weight is not None  # the loader attached the target's
    # every token the block embeds is one of the Boundaries' own or the mask token: a NaN row read anyway
    # (a dump's stand-in holds only those rows) would poison every score without a word
    require_finite_rows(
        draft.embed_weight, torch.cat([bounds.input_ids.flatten(), torch.tensor([draft.block.mask_token_id])]), where
    )
    pos = block_entries(bounds, draft.block.block_size, draft.block.label_offset)
    m = compare(lambda taps: block_score(draft, bounds, pos, taps), pos, bounds.num_layers, delivered, reasons, priors)
    m.tau["best"] = block_tau(m.scores[m.best], pos)
    if delivered is not None:
        m.tau["delivered"] = block_tau(m.scores[delivered], pos)
    return m


def engine_run(target: Any, draft: DFlashDraft, shape: TreeShape, m: Measurement) -> EngineRun:
    """Our engine at the engine's knobs (vLLM num_speculative_tokens k: the block drafted whole, its first k
    drafts verified), once per tap set: compose's proposer of the draft's family (the block proposer) beside
    the plain runtime, greedy on the built-in prompts, as `doctor expect` predicts. A DSpark draft decodes
    with its backbone alone (its Markov head, which biases the drafts, is not run): a lower bound on its tau."""
    assert draft.contract is not None  # the backbone loader attaches the contract it decodes with
    if isinstance(target, DumpTarget):  # decoding needs the target's weights, which a dump does not hold
        return EngineRun(shape, 0, 0, skipped="a boundaries dump holds no target to decode with: use --target")
    try:
        chain = block_shape(draft.contract, shape)
    except EaglewireError as err:
        return EngineRun(shape, 0, 0, skipped=f"{err.what} (expected {err.expected})")
    return run_engine(target, draft, draft.contract, chain, {"delivered": m.delivered, "best": m.best})


def block_fmt(m: Measurement, taps: Taps) -> str:
    """A tap set's scores as a block drafter's finding names them."""
    s = m.scores[taps]
    return f"{list(taps)}: block NLL {s.mean_nll:.2f}, agreement {s.agreement:.2f}"


def block_where(m: Measurement) -> str:
    """What was scored, and each set's teacher-forced tau of a round (and our engine's, when it ran)."""
    tau = ", ".join(f"{k} {v[0]:.2f}" for k, v in sorted(m.tau.items()))
    return (
        f" ({m.tokens} block slots scored; teacher-forced tau of a round: {tau}"
        f"{m.engine.text() if m.engine is not None else ''})"
    )


def block_fix(m: Measurement, config: dict[str, Any], engine: str, L: int) -> str:
    _, f = read_ids(config, engine)
    try:
        ids = list(to_engine(m.best, f.convention, L))
    except EaglewireError as err:
        return f"{engine} cannot capture boundaries {list(m.best)} through {f.field} ({err.what})"
    drop = (
        " and drop eagle_aux_hidden_state_layer_ids"
        if f.field not in OVERRIDES and _get(config, OVERRIDES[0]) is not None
        else ""
    )
    return f"write {f.field}: {ids} (boundaries {list(m.best)} in {engine}'s numbering){drop}, re-run the doctor"


def block_finding(m: Measurement, config: dict[str, Any], engine: str, L: int, how: str) -> Finding:
    """error when the delivered set is clearly worse than the best (trained_taps.py's rule), else info."""
    delivered = block_fmt(m, m.delivered) if m.delivered is not None else ""
    return wiring_finding(
        m,
        engine,
        f"this block drafter predicts best from boundaries {block_fmt(m, m.best)}",
        delivered,
        block_where(m),
        block_fix(m, config, engine, L),
        cannot=how,
        how=f" ({how})",
    )
