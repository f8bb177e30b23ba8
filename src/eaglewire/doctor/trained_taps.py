"""Which boundaries was a draft trained on? Measured from the draft itself, teacher-forced on the target.

A draft predicts the target's next token better from the states it was trained on than from any other
states. Top-1 agreement alone is too coarse to tell neighbours apart (the released draft: 0.210 on its
trained [2, 15, 27], 0.200 on [1, 14, 26]), so the measure is the mean NLL the draft gives the target's
token at the first draft position, paired (the same tokens under every candidate), with agreement beside.

The verdict rule (MARGIN, LEVEL): the delivered tap set is an error when another set beats it and the
lower end of a LEVEL paired block-bootstrap interval of NLL(delivered) - NLL(best) is above MARGIN nats.
Blocks are BLOCK consecutive positions of one prompt (neighbouring tokens are not independent). The best
set is chosen on the same tokens (a winner's curse of a few hundredths of a nat between near-equal sets),
which MARGIN absorbs. A weakly trained draft predicts about as well from any states: its interval is wide
and its spread (worst minus best candidate) small; the report then says the evidence is weak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import torch
import torch.nn.functional as F

from eaglewire.capture.boundaries import Boundaries
from eaglewire.doctor.findings import Finding
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import EaglewireError
from eaglewire.draft.unroll import shift_left, ttt_attention_mask

if TYPE_CHECKING:
    from eaglewire.doctor.measured_tau import EngineRun

MARGIN, LEVEL, BLOCK, RESAMPLES = 0.05, 0.99, 16, 2000
WEAK_SPREAD = 0.5  # nats between the best and the worst candidate below which the evidence is weak
Taps = tuple[int, ...]


@dataclass
class Positions:
    """Where the draft is scored: draft position j of row b predicts the target's label at j+1."""

    rows: torch.Tensor  # [N] batch row of each scored position (target token in the draft vocab)
    cols: torch.Tensor  # [N] draft position j
    label: torch.Tensor  # [N] the target's token as a draft-vocab id
    blocks: torch.Tensor  # [N] bootstrap block id
    chain_rows: torch.Tensor  # [M] positions where a whole chain of `steps` drafts can be checked
    chain_cols: torch.Tensor  # [M]
    chain_labels: torch.Tensor  # [M, steps] draft-vocab ids of the target's tokens, -1 = not in the draft vocab
    coverage: float  # share of answer positions whose target token the draft vocab holds


def target_to_draft(draft: Eagle3Draft) -> torch.Tensor:
    """[V] draft id of each target id, -1 where the draft vocab lacks it (d2t holds offsets)."""
    out = torch.full((draft.cfg.vocab_size,), -1, dtype=torch.long)
    vd = torch.arange(draft.cfg.draft_vocab_size)
    out[vd + draft.d2t.long()] = vd
    return out


def positions(bounds: Boundaries, draft: Eagle3Draft, steps: int) -> Positions:
    t2d = target_to_draft(draft)
    lab = torch.where(bounds.scored, t2d[bounds.labels], -2)  # [B, T] -2 = not scored, -1 = not in vocab
    nxt = shift_left(lab, 1, -2)  # [B, T] draft position j predicts label j+1
    rows, cols = (nxt >= 0).nonzero(as_tuple=True)
    # A chain at j drafts labels j+1..j+steps fed tokens j+1..j+steps: teacher forcing is what the
    # engine sees only where each fed token is the target's own greedy token (true on answers).
    greedy = shift_left(bounds.input_ids, 1) == bounds.labels  # [B, T] token t+1 is the label of t
    ok = torch.ones_like(bounds.scored)
    for s in range(steps):
        ok &= shift_left(lab, 1 + s, -2) > -2
        if s:
            ok &= shift_left(greedy, s, False)
    crow, ccol = ok.nonzero(as_tuple=True)
    chain = (
        torch.stack([lab[crow, ccol + 1 + s] for s in range(steps)], dim=-1)
        if len(crow)
        else torch.zeros((0, steps), dtype=torch.long)
    )
    return Positions(
        rows,
        cols,
        nxt[rows, cols],
        rows * 10_000 + cols // BLOCK,
        crow,
        ccol,
        chain,
        float((nxt >= 0).sum()) / max(1, int((nxt > -2).sum())),
    )


@torch.no_grad()
def _normed(draft: Eagle3Draft, bounds: Boundaries, taps: Taps, steps: int) -> list[torch.Tensor]:
    """Teacher-forced draft steps exactly as in training (train/ttt.py): per step the normed state [B, T, H]."""
    ids = bounds.input_ids
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T)
    # The slots shifted in at the end are seen by no scored position (causal mask, chains end before them),
    # so their token is free: one of the batch's own keeps every embedded id one the Boundaries hold, so a
    # hidden-state dump's stand-in embedding (capture/boundary_file.py) covers every row read. Training pads with 0.
    fill = int(ids[0, 0])
    # a dump may hold bf16 states (big targets): the draft is scored in its own (fp32) dtype
    hidden, past, out = draft.fuse(bounds.taps(taps).to(draft.fc.weight.dtype)), None, []  # [B, T, H]
    for k in range(steps):
        o = draft.step(
            shift_left(ids, 1 + k, fill), hidden, pos + k, ttt_attention_mask(T, k), past, compute_logits=False
        )
        hidden, past = o.hidden, o.kv
        out.append(o.normed)
    return out


@dataclass
class Score:
    taps: Taps
    nll: torch.Tensor  # [N] NLL of the target's token at the first draft position
    hit: torch.Tensor  # bool [N] draft top-1 == the target's token

    @property
    def mean_nll(self) -> float:
        return float(self.nll.mean())

    @property
    def agreement(self) -> float:
        return float(self.hit.float().mean())


@torch.no_grad()
def first_step(draft: Eagle3Draft, bounds: Boundaries, pos: Positions, taps: Taps) -> Score:
    logits = draft.lm_head(_normed(draft, bounds, taps, 1)[0][pos.rows, pos.cols]).float()  # [N, V_d]
    nll = -F.log_softmax(logits, -1).gather(-1, pos.label[:, None])[:, 0]
    return Score(taps, nll, logits.argmax(-1) == pos.label)


@torch.no_grad()
def chain(draft: Eagle3Draft, bounds: Boundaries, pos: Positions, taps: Taps) -> tuple[float, list[float]]:
    """Greedy chain acceptance, teacher-forced: tau = 1 + mean accepted run of `steps` drafts, and the
    acceptance of each step given the steps before it were accepted (what an engine's k-chain measures)."""
    steps = pos.chain_labels.shape[1]
    if not len(pos.chain_rows):
        return 1.0, [0.0] * steps
    normed = _normed(draft, bounds, taps, steps)
    hits = torch.stack([draft.lm_head(n[pos.chain_rows, pos.chain_cols]).argmax(-1) for n in normed], -1)
    run = (hits == pos.chain_labels).cumprod(-1)  # [M, steps] 1 while every draft so far was accepted
    alive = torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], -1).sum(0).clamp_min(1)
    return 1.0 + float(run.sum(-1).float().mean()), (run.sum(0) / alive).tolist()


class Blocked(Protocol):
    """Scored positions grouped into bootstrap blocks (Positions; a block drafter's, doctor/measured_block.py)."""

    blocks: torch.Tensor  # [N] bootstrap block id of each scored entry (the Score.nll order)


def paired_interval(worse: Score, best: Score, pos: Blocked, seed: int = 0) -> tuple[float, float, float]:
    """Mean NLL(worse) - NLL(best) and its LEVEL block-bootstrap interval."""
    diff = worse.nll - best.nll  # [N] paired: the same positions
    _, block = torch.unique(pos.blocks, return_inverse=True)
    sums = torch.zeros(int(block.max()) + 1).index_add_(0, block, diff)  # [M]
    counts = torch.zeros_like(sums).index_add_(0, block, torch.ones_like(diff))
    g = torch.Generator().manual_seed(seed)
    draw = torch.randint(0, len(sums), (RESAMPLES, len(sums)), generator=g)  # [R, M]
    means = sums[draw].sum(1) / counts[draw].sum(1)
    tail = (1 - LEVEL) / 2
    lo, hi = torch.quantile(means, torch.tensor([tail, 1 - tail])).tolist()
    return float(diff.mean()), lo, hi


def _ascending(taps: Taps, L: int) -> bool:
    return all(0 <= a < b <= L for a, b in zip(taps, taps[1:])) and 0 <= taps[0] and taps[-1] <= L


def search(score: Callable[[Taps], Score], start: Taps, L: int, rounds: int = 3) -> Taps:
    """Coordinate search from `start`: each tap in turn over its allowed range (stride L//10, then ±1),
    keeping the others; repeated until nothing improves. Scores are cached by the caller."""
    best, stride = start, max(1, L // 10)
    for _ in range(rounds):
        before = best
        for step in dict.fromkeys((stride, 1)):
            for i in range(len(best)):
                lo = best[i - 1] + 1 if i else 0
                hi = best[i + 1] - 1 if i + 1 < len(best) else L
                values = range(lo, hi + 1, step) if step > 1 else range(max(lo, best[i] - 1), min(hi, best[i] + 1) + 1)
                for v in values:
                    cand = best[:i] + (v,) + best[i + 1 :]
                    if _ascending(cand, L) and score(cand).mean_nll < score(best).mean_nll:
                        best = cand
        if best == before:
            break
    return best


@dataclass
class Measurement:
    """What the empirical check found; `delivered` None = the engine cannot capture its ids at all."""

    delivered: Taps | None
    best: Taps
    scores: dict[Taps, Score]
    reasons: dict[Taps, list[str]]
    gap: tuple[float, float, float] | None  # NLL(delivered) - NLL(best): mean, interval low, high
    spread: float  # worst candidate NLL - best NLL (how strongly the draft prefers some states to others)
    coverage: float
    tokens: int
    tau: dict[str, tuple[float, list[float]]] = field(default_factory=dict)  # "delivered"/"best": tau, per step
    engine: EngineRun | None = None  # our engine's τ at the engine's knobs (measured_tau.py), when asked

    @property
    def weak(self) -> bool:
        return self.spread < WEAK_SPREAD

    @property
    def clearly_worse(self) -> bool:
        """The rule: the delivered set loses to the best by more than MARGIN at the LEVEL interval's low end."""
        if self.delivered is None:
            return True
        return self.delivered != self.best and self.gap is not None and self.gap[1] > MARGIN

    def row(self, taps: Taps) -> dict[str, object]:
        s = self.scores[taps]
        return {
            "taps": list(taps),
            "nll": round(s.mean_nll, 3),
            "agreement": round(s.agreement, 3),
            "why": self.reasons.get(taps, ["search"]),
        }

    def to_dict(self) -> dict[str, object]:
        order = sorted(self.scores, key=lambda t: self.scores[t].mean_nll)
        return {
            "delivered": list(self.delivered) if self.delivered else None,
            "best": list(self.best),
            "nll_gap": self.gap and [round(x, 3) for x in self.gap],
            "interval_level": LEVEL,
            "margin": MARGIN,
            "spread": round(self.spread, 3),
            "weak_evidence": self.weak,
            "coverage": round(self.coverage, 3),
            "tokens": self.tokens,
            "error": self.clearly_worse,
            "tau": {
                **{k: {"tau": round(v[0], 3), "per_step": [round(x, 3) for x in v[1]]} for k, v in self.tau.items()},
                **(self.engine.to_dict() if self.engine else {}),
            },
            "candidates": [self.row(t) for t in order],
        }


def measure(
    draft: Eagle3Draft,
    bounds: Boundaries,
    delivered: Taps | None,
    reasons: dict[Taps, list[str]],
    chain_steps: int = 3,
    priors: tuple[Taps, ...] = (),
) -> Measurement:
    """Score every labelled candidate, search around the best, and compare the delivered set with it.
    `priors`: the sets a reading of the config gives (delivered, other conventions, defaults), in order."""
    pos = positions(bounds, draft, chain_steps)
    if not pos.rows.numel():  # no paired entries: every score and interval below would be empty
        raise EaglewireError(
            "nothing to measure: the draft's vocabulary holds none of the target's answer tokens",
            expected="answer positions whose target token the draft can name",
            found=f"coverage {pos.coverage:.0%} of {bounds.input_ids.numel()} tokens",
            fix="measure on prompts in the draft's domain, or check its vocab map (d2t)",
        )
    m = compare(
        lambda taps: first_step(draft, bounds, pos, taps),
        pos,
        bounds.num_layers,
        delivered,
        reasons,
        priors,
        pos.coverage,
    )
    if chain_steps:
        m.tau["best"] = chain(draft, bounds, pos, m.best)
        if delivered is not None:
            m.tau["delivered"] = chain(draft, bounds, pos, delivered)
    return m


def compare(
    scorer: Callable[[Taps], Score],
    pos: Blocked,
    L: int,
    delivered: Taps | None,
    reasons: dict[Taps, list[str]],
    priors: tuple[Taps, ...] = (),
    coverage: float = 1.0,
) -> Measurement:
    """The rule every family's measurement shares: score the labelled candidates (and the delivered set) with
    `scorer` (paired: every Score over the same entries, grouped by `pos.blocks`), search around the best,
    name a prior that the best does not beat by MARGIN, and the delivered set's paired gap to the best."""
    scores: dict[Taps, Score] = {}

    def score(taps: Taps) -> Score:
        if taps not in scores:
            scores[taps] = scorer(taps)
        return scores[taps]

    for taps in (*reasons, *([delivered] if delivered is not None else [])):
        score(taps)
    search(score, min(scores, key=lambda t: scores[t].mean_nll), L)
    best = min(scores, key=lambda t: scores[t].mean_nll)  # the search may have scored a better one on the way
    # Neighbouring taps can be near-ties (the released draft: [2, 15, 27] vs [2, 17, 27], 0.02 nats). A
    # wiring some engine would really produce from these ids (`priors`: delivered first) that the search's
    # best does not beat by MARGIN is named instead of a set no reading of the config gives.
    for prior in priors if best not in priors else ():
        if prior in scores and paired_interval(scores[prior], scores[best], pos)[1] <= MARGIN:
            best = prior
            break
    nlls = sorted(s.mean_nll for s in scores.values())
    gap = paired_interval(scores[delivered], scores[best], pos) if delivered is not None else None
    return Measurement(delivered, best, scores, reasons, gap, nlls[-1] - nlls[0], coverage, len(scores[best].nll))


def wiring_finding(
    m: Measurement, engine: str, best: str, delivered: str, where: str, fix: str, *, cannot: str, how: str = ""
) -> Finding:
    """The measured wiring's verdict, one rule for every drafter family: error when the engine delivers no
    set the draft can be scored on (`cannot` says why) or a set clearly worse than the best (MARGIN, LEVEL),
    else info. The family says what was measured in its own words: `best` (the best set), `delivered` (the
    delivered set's scores), `where` (what was scored, and its tau), `how` (the engine rule applied)."""
    weak = (
        f" Weak evidence: the draft predicts almost as well from any states (worst - best = "
        f"{m.spread:.2f} nats); a better-trained draft gives a sharper answer."
        if m.weak
        else ""
    )
    rule = (
        f"rule: error when the low end of the {LEVEL:.0%} paired block-bootstrap interval of "
        f"NLL(delivered) - NLL(best) exceeds {MARGIN} nats"
    )
    if m.delivered is None:
        return Finding(
            "error",
            "measured_wiring",
            f"{best}; {cannot}{where}",
            "the engine feeds other or fewer states than the draft was trained on" + weak,
            fix,
        )
    mean, lo, hi = m.gap or (0.0, 0.0, 0.0)
    gap = f"NLL gap {mean:.2f} [{lo:.2f}, {hi:.2f}] at {LEVEL:.0%}"
    if m.clearly_worse:
        return Finding(
            "error",
            "measured_wiring",
            f"{best}; {engine} will deliver {delivered}{how} — {gap}{where}",
            "the draft was trained on other states than the engine delivers: acceptance falls with no "
            "error message (" + rule + ")." + weak,
            fix,
        )
    verdict = (
        "the delivered taps are the best measured"
        if m.delivered == m.best
        else f"the best set {list(m.best)} is not clearly better ({gap})"
    )
    return Finding(
        "info",
        "measured_wiring",
        f"measured: {engine} will deliver {delivered}; {verdict}{where}",
        rule + "." + weak,
        "nothing to fix",
    )


def suspect_adder(out: dict[Taps, list[str]], n: int, L: int) -> Callable[[Taps | None, str], None]:
    """add(taps, why): records a candidate tap set with why it is a suspect, for every family's measurement:
    only sets of the draft's width n whose boundaries rise strictly inside [0, L]."""

    def add(taps: Taps | None, why: str) -> None:
        if (
            taps is not None
            and len(taps) == n
            and all(0 <= a < b <= L for a, b in zip(taps, taps[1:]))
            and 0 <= taps[0]
            and taps[-1] <= L
        ):
            out.setdefault(tuple(taps), []).append(why)

    return add
