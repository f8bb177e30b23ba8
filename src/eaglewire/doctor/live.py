"""`eaglewire doctor live`: is a RUNNING engine getting from the draft what the draft should give?

    before = snapshot(url)                     # the engine's speculative counters (doctor/counters.py)
    answers = [chat(url, m) for m in prompts]  # greedy, a fixed budget, one request at a time (bounded)
    window = snapshot(url).minus(before)       # tau and per-position acceptance of THESE requests only
    ours = reference(target, draft, ...)       # our engine on the same prompts at the engine's shape
    report = compare(window, ours, ...)        # healthy / below expectation (and where) / no counters

Deltas, not totals: a server that has run for days carries its history in the counters; only the window
between two snapshots is the probe's. Other traffic during the window is counted too, so probe a server
that is otherwise idle, or read the result as "the server's acceptance over that minute".

The verdict reuses `doctor expect`'s rule (doctor/expect.py: tau below RATIO x predicted and MARGIN below
it, or the first position's Wilson interval below the prediction) and adds WHERE acceptance is lost, from
the conditional acceptance at each draft position (rounds accepted at i / rounds accepted at i-1; live_positions.py):
- the first position low: the draft does not see what it was trained on at all (taps, fc, the vocabulary map,
  embedding / lm_head): `eaglewire doctor check`, then `doctor dump-vllm` + `doctor probe`;
- the first fine, later ones low: the draft's own recurrence differs (norm flags applied to the state fed
  back, TTT depth trained shorter than the engine drafts, a block drafter's block layout):
  `eaglewire doctor check --num-speculative-tokens k`.
Positions count the draft tokens of a round in order, so the same pattern reads for any family that drafts k
tokens a round (EAGLE-3's chain, a DFlash block). llama-server (with --metrics) has the same counters as vLLM under
`llamacpp:`; it adds a request's counts when the request ends, which the probe's one-at-a-time requests wait for.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from eaglewire.doctor.counters import LLAMACPP_TIMINGS, Counters, detect_engine, read_counters
from eaglewire.doctor.expect import Counts, Expectation, judge
from eaglewire.doctor.live_lossless import TIE_LOGITS, Divergence
from eaglewire.doctor.live_lossless import judge as lossless_judge
from eaglewire.doctor.live_positions import PositionFinding, low_positions, pointer
from eaglewire.errors import EaglewireError
from eaglewire.target.protocol import RunnableTarget
from eaglewire.data.template import chat_ids

HTTP_TIMEOUT_S = 600.0  # one greedy request on a loaded CPU server; every loop here is over a finite list
VERDICTS = ("healthy", "below_expectation", "no_counters", "not_lossless")  # not_lossless: doctor/live_lossless.py


def server_root(url: str) -> str:
    """http://host:port from http://host:port[/v1][/]."""
    return url.rstrip("/").removesuffix("/v1")


def _get(url: str, timeout: float = 30.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except (urllib.error.URLError, OSError) as err:
        raise EaglewireError(
            f"cannot read {url}",
            expected="a running engine answering on that address",
            found=str(err),
            fix="check --url (http://127.0.0.1:PORT) and that the server is up",
        ) from None


def snapshot(url: str, engine: str | None = None) -> Counters:
    """The server's counters now (engine detected from its /metrics when not given)."""
    text = _get(server_root(url) + "/metrics")
    return read_counters(engine or detect_engine(text), text)


def served_model(url: str) -> str:
    data = json.loads(_get(server_root(url) + "/v1/models"))
    return data["data"][0]["id"]


def served_numerics(url: str) -> dict[str, Any]:
    """What the server says it computes in ({"dtype", "runtime", "shape"}: `eaglewire serve` says; vLLM and
    SGLang do not, {})."""
    data = json.loads(_get(server_root(url) + "/v1/models"))
    about = data["data"][0].get("eaglewire") if data.get("data") else None
    return about if isinstance(about, dict) else {}


@dataclass
class Answer:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    decode_s: float  # first streamed token to the last: the decode rounds' time, without prefill
    timings: dict[str, Any] = field(default_factory=dict)  # llama-server's per-request draft_n, draft_n_accepted


def chat(url: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> Answer:
    """One greedy streamed chat completion (the server applies its chat template, as for any client)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        server_root(url) + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    parts, usage, timings, first, last = [], {}, {}, None, None
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
            for raw in r:  # bounded: the server ends the stream after max_tokens at most
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                timings = event.get("timings") or timings  # llama-server: on its last chunk
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first, last = first or time.perf_counter(), time.perf_counter()
                        parts.append(piece)
    except (urllib.error.URLError, OSError) as err:
        raise EaglewireError(
            "the engine did not answer a chat completion", expected="200 with a streamed answer", found=str(err)
        ) from None
    return Answer(
        "".join(parts),
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        (last - first) if first is not None else 0.0,
        {k: int(timings[k]) for k in LLAMACPP_TIMINGS if k in timings},
    )


@dataclass
class EngineWindow:
    counters: Counters  # the delta over the probe's requests
    answers: list[Answer]
    seconds: float


def probe_engine(
    url: str, chats: list[list[dict[str, str]]], max_tokens: int, engine: str | None = None, model: str | None = None
) -> EngineWindow:
    """Snapshot, the prompts one at a time, snapshot: the window's counters and the engine's answers."""
    before = snapshot(url, engine)
    model = model or served_model(url)
    t0 = time.perf_counter()
    answers = [chat(url, model, m, max_tokens) for m in chats]
    seconds = time.perf_counter() - t0
    return EngineWindow(snapshot(url, before.engine).minus(before), answers, seconds)


def chat_prompts(tok: Any, chats: list[list[dict[str, str]]]) -> list[Any]:
    """Each chat rendered with the target's template, [1, P] ids (as our reference decodes them)."""
    return [chat_ids(tok, m) for m in chats]


@dataclass
class Reference:
    """Our engine on the same prompts at the engine's shape, and the target's own greedy answers."""

    tau: float
    per_position: list[float]
    answers: list[str]
    prompt_tokens: list[int]
    tokens: list[list[int]] = field(default_factory=list)  # the answers' token ids (live_lossless reads them)
    dtype: str = "float32"  # the target's, as the reference decoded it


def reference(
    target: RunnableTarget, draft: Any, contract: Any, shape: Any, chats: list[list[dict[str, str]]], max_tokens: int
) -> Reference:
    """Our engine on the chats at `shape`, with the proposer of the draft's family (eaglewire.compose); any
    family whose proposer drafts shape.num_steps tokens a round gets per-position figures the engines'
    counters compare with."""
    from eaglewire.compose import decoder
    from eaglewire.decoding.engine import SpecStats

    tok = target.tokenizer
    prompts = chat_prompts(tok, chats)
    # tau does not depend on how fast the GEMMs run: the plain runtime
    dec = decoder(
        target,
        draft,
        shape,
        max_tokens,
        context=max(p.shape[1] for p in prompts) + max_tokens,
        accelerate=False,
        calibrate=False,
        contract=contract,
    )
    eos, pooled, answers, tokens = {tok.eos_token_id}, SpecStats(), [], []
    for ids in prompts:
        # our speculative decoder's greedy answer IS the target's own greedy answer (lossless by construction,
        # tests/decoding/test_spec_lossless.py), so one decode gives both the reference answer and the predicted tau
        toks, st = dec.generate(ids, max_tokens, eos)
        pooled.accepted += st.accepted
        answers.append(tok.decode(toks, skip_special_tokens=True))
        tokens.append([int(t) for t in toks])
    return Reference(
        pooled.tau if pooled.accepted else 0.0,
        pooled.per_position(shape.num_steps),
        answers,
        [int(p.shape[1]) for p in prompts],
        tokens,
        str(target.dtype).removeprefix("torch."),
    )


@dataclass
class LiveReport:
    engine: str
    verdict: str
    message: str
    k: int
    measured: dict[str, Any]
    predicted: dict[str, Any]
    lossless: dict[str, Any]
    low_positions: list[dict[str, Any]] = field(default_factory=list)
    points_at: str = ""
    next_command: str = ""
    timing: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def lossless_check(
    window: EngineWindow,
    ref: Reference,
    divs: list[Divergence] | None = None,
    tol: float = TIE_LOGITS["bfloat16"],
    numerics: str = "",
) -> dict[str, Any]:
    """The engine's greedy answers against the target's own (text; the server's prompt length against ours),
    and every difference's cause (doctor/live_lossless.py): `ok` False where one is not a near-tie."""
    same = [a.text == b for a, b in zip(window.answers, ref.answers)]
    first = [
        next((i for i, (x, y) in enumerate(zip(a.text, b)) if x != y), min(len(a.text), len(b)))
        for a, b, s in zip(window.answers, ref.answers, same)
        if not s
    ]
    template = [a.prompt_tokens for a in window.answers] == ref.prompt_tokens or all(
        a.prompt_tokens is None for a in window.answers
    )
    if divs is None and not all(same):  # nobody measured the margins: a difference is not explained
        ok, cause = (
            False,
            (
                f"{len(same) - sum(same)} answer(s) differ from the target's greedy answers and their "
                "margins were not measured"
            ),
        )
    else:
        ok, cause = lossless_judge(divs or [], template, tol, numerics)
    return {
        "identical": sum(same),
        "prompts": len(same),
        "first_difference_chars": first,
        "engine_prompt_tokens": [a.prompt_tokens for a in window.answers],
        "our_prompt_tokens": ref.prompt_tokens,
        "same_template": template,
        "ok": ok,
        "cause": cause,
        "divergences": [vars(d) for d in divs or []],
    }


def compare(
    window: EngineWindow,
    ref: Reference,
    k: int,
    draft: str,
    target: str | None,
    divs: list[Divergence] | None = None,
    tol: float = TIE_LOGITS["bfloat16"],
    numerics: str = "",
) -> LiveReport:
    """The verdict (module docstring); an answer that differs from the target's beyond a near-tie makes it
    `not_lossless` whatever the counters say (divs: live_lossless.divergences of the answers that differ)."""
    c = window.counters
    measured = c.to_dict()
    if any(a.timings for a in window.answers):  # llama-server's own per-request figures, beside its counters
        measured["request_timings"] = {k: sum(a.timings.get(k, 0) for a in window.answers) for k in LLAMACPP_TIMINGS}
    predicted = {"tau": round(ref.tau, 4), "per_position": [round(p, 4) for p in ref.per_position]}
    lossless = lossless_check(window, ref, divs, tol, numerics)
    if not lossless["ok"]:
        return LiveReport(
            c.engine,
            "not_lossless",
            "the engine's answers are not the target's: " + lossless["cause"],
            k,
            measured,
            predicted,
            lossless,
            next_command="serve at the dtype the answers must match "
            "(eaglewire serve --dtype float32), greedy (temperature 0), with the target's chat template",
        )
    if not c.exposed or (c.drafts is not None and c.drafts == 0):
        return _no_counters(c, ref, k, measured, predicted, lossless)
    counts = Counts(c.drafts, list(c.accepted_per_pos)) if c.drafts and c.accepted_per_pos else None
    exp = judge(ref.tau, ref.per_position, c.tau, counts)
    low = low_positions(c, ref.per_position) if counts else []
    msg = exp.message + (
        "" if not c.gauge_only else " (SGLang's gauge: the mean of its last log interval, no per-position counters)"
    )
    if lossless["cause"]:  # every difference a near-tie: the verdict stands, and names it
        msg += "; " + lossless["cause"]
    flagged = exp.flagged or bool(low)
    rep = LiveReport(
        c.engine,
        "below_expectation" if flagged else "healthy",
        msg,
        k,
        measured,
        predicted,
        lossless,
        [vars(f) for f in low],
    )
    if flagged:
        _say_where(rep, exp, low, ref.tau - (c.tau or 0.0), ref.tau, draft, target)
    return rep


def _no_counters(
    c: Counters, ref: Reference, k: int, measured: dict[str, Any], predicted: dict[str, Any], lossless: dict[str, Any]
) -> LiveReport:
    """The engine exposes no speculative counters, or they did not move: nothing to judge tau by."""
    why = (
        "the engine exposes no speculative counters"
        if not c.exposed
        else "the engine's speculative counters did not move while the probe ran: it is not speculating"
    )
    return LiveReport(
        c.engine,
        "no_counters",
        f"{why} (our engine predicts tau {ref.tau:.2f})",
        k,
        measured,
        predicted,
        lossless,
        next_command="start the engine with its speculative config "
        "(vLLM --speculative-config, SGLang --speculative-algorithm EAGLE3, llama-server "
        "-md DRAFT.gguf --spec-type draft-eagle3)",
    )


def _say_where(
    rep: LiveReport, exp: Expectation, low: list[PositionFinding], by: float, tau: float, draft: str, target: str | None
) -> None:
    """A flagged report: what the loss points at, the command to run next, and how far below (`by` tau of the
    predicted `tau`)."""
    if low:
        rep.points_at, rep.next_command = pointer(low, draft, target, rep.k)
    else:  # tau alone: no per-position counters (SGLang), or every position a little low
        rep.points_at = "tau far below the prediction, no single position stands out: " + "; ".join(exp.causes[:3])
        rep.next_command = f"eaglewire doctor check {draft}" + (f" --target {target}" if target else "")
    rep.message = (
        f"below expectation by {by:.2f} tau ({by / max(tau - 1, 1e-9):.0%} of the draft's "
        f"predicted gain): " + rep.message
    )
