"""`doctor live` never calls a mismatch healthy without its cause: a server (eaglewire's HTTP layer and worker,
decoding with the real target and released draft) whose answer is changed at one token gets `not_lossless`
with the margin and both sides' dtype named; a difference at a near-tie keeps the verdict and says so; an
unmeasured difference is an error."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from eaglewire.doctor.counters import Counters
from eaglewire.doctor.live import Answer, EngineWindow, Reference, compare
from eaglewire.doctor.live_lossless import Divergence, first_divergence, numerics_line

K, MAX_TOKENS = 3, 24
ABOUT = {"dtype": "float32", "runtime": "StaticRuntime", "shape": "S3 K1 N4"}


def _window(answers: tuple[str, ...]) -> EngineWindow:
    c = Counters("vllm", drafts=400, draft_tokens=1200, accepted=400, accepted_per_pos=(240, 120, 40))
    return EngineWindow(c, [Answer(t, n, 5, 0.1) for t, n in zip(answers, (10, 12))], 1.0)


REF = Reference(tau=1.9, per_position=[0.6, 0.3, 0.1], answers=["a b", "c"], prompt_tokens=[10, 12])


def test_a_difference_at_a_near_tie_keeps_the_verdict_and_names_the_dtypes():
    tie = [Divergence(0, 1, " b", " B", 2e-5)]
    rep = compare(_window(("a B", "c")), REF, 3, "d", None, tie, 1e-3, numerics_line("float32", ABOUT))
    assert rep.verdict == "healthy" and rep.lossless["ok"]
    assert "near-tie" in rep.message and "float32" in rep.message and "StaticRuntime" in rep.message


def test_a_difference_beyond_rounding_or_unmeasured_is_an_error():
    far = [Divergence(0, 1, " b", " zebra", 7.5)]
    rep = compare(_window(("a zebra", "c")), REF, 3, "d", None, far, 1e-3, numerics_line("float32", {}))
    assert rep.verdict == "not_lossless" and "beyond rounding" in rep.message and "7.5 logits" in rep.message
    assert "does not report its dtype" in rep.message
    assert compare(_window(("a zebra", "c")), REF, 3, "d", None).verdict == "not_lossless"  # no margins read


@pytest.fixture(scope="module")
def smol():
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.target.loader import load_target

    target = load_target()
    return target, resolve_draft(None), load_checkpoint(resolve_draft(None), target=target)


@pytest.fixture(scope="module")
def altered_server(smol):
    """eaglewire's server decoding for real, except that the second answer's 6th token is swapped for ' zebra'."""
    from eaglewire.decoding.engine import SpecDecoder
    from eaglewire.decoding.propose import EagleProposer
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.serve.server import SpecServer, serve

    target, _, draft = smol
    shape, max_len, seen = TreeShape.chain(K), 1024, []
    decoder = SpecDecoder(plain_runtime(target, max_len + K + 8), EagleProposer(draft, shape, max_len))
    eos, zebra = {target.tokenizer.eos_token_id}, target.tokenizer(" zebra", add_special_tokens=False)["input_ids"][0]

    def generate(job, on_tokens):
        toks, stats = decoder.generate(job.prompt_ids, job.max_tokens, eos)
        seen.append(1)
        on_tokens(toks[:5] + [zebra] + toks[6:] if len(seen) == 2 else toks)
        return stats

    srv = SpecServer(generate, target.tokenizer, "smol", 256, max_len, eos=eos, draft_depth=K, about=ABOUT)
    httpd = serve(srv, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.real_target
def test_doctor_live_calls_an_altered_answer_not_lossless(smol, altered_server):
    from eaglewire.cli.app import app

    r = CliRunner().invoke(
        app,
        [
            "doctor",
            "live",
            "--url",
            altered_server,
            "--draft",
            str(smol[1]),
            "--limit",
            "2",
            "--max-tokens",
            str(MAX_TOKENS),
            "--json",
        ],
    )
    assert r.exit_code == 1, r.output
    rep = json.loads(r.output[r.output.index("{") :])
    assert rep["verdict"] == "not_lossless", rep
    ll = rep["lossless"]
    assert ll["identical"] == 1 and not ll["ok"] and ll["same_template"]
    (d,) = ll["divergences"]
    assert d["answer"] == 1 and d["token"] == 5 and d["theirs"] == " zebra" and d["margin"] > 1.0
    assert "target float32" in rep["message"] and "S3 K1 N4" in rep["message"]


@pytest.mark.real_target
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 20), word=st.sampled_from([" zebra", " Paris", "!!", "\n\n"]))
def test_first_divergence_finds_the_token_where_a_text_leaves_the_reference(smol, cut, word):
    """Any reference cut at any token and continued with another word: the divergence sits at that token (or
    later, where the word happens to begin like the reference's next tokens), and its decoded prefix starts
    the altered text."""
    import torch

    target = smol[0]
    tok = target.tokenizer
    ref = tok(
        "The sea is calm tonight, and the stars are bright over the quiet harbour town.", add_special_tokens=False
    )["input_ids"]
    cut = min(cut, len(ref))
    text = tok.decode(ref[:cut]) + word
    d = first_divergence(target, torch.tensor([tok("Hi")["input_ids"]]), ref, text, 0)
    assert d.token >= cut and text.startswith(tok.decode(ref[: d.token]))
    assert d.margin >= 0.0
