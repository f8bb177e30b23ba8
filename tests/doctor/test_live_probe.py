"""`eaglewire doctor live` and `doctor watch` against eaglewire's own server (real HTTP on loopback, the
embedded SmolLM2 target and the released draft): its /metrics carries vLLM's speculative names, the probe
reads them as it reads vLLM, and finds the server healthy with our engine's tau; the alarm rings on it."""

from __future__ import annotations

import json
import threading

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.real_target

PORT, K, MAX_TOKENS = 18301, 3, 32


@pytest.fixture(scope="module")
def served():
    """eaglewire's server (serve/server.py: its HTTP handler, worker and /metrics) on the plain runtime: the
    fastcpu runtime `eaglewire serve` builds calibrates GEMM layouts first (minutes once per machine), and
    which runtime decodes changes no counter."""
    from eaglewire.decoding.engine import SpecDecoder
    from eaglewire.decoding.propose import EagleProposer
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.serve.server import SpecServer, serve
    from eaglewire.target.loader import load_target

    target = load_target()
    draft_dir = resolve_draft(None)
    draft = load_checkpoint(draft_dir, target=target)
    shape, max_len = TreeShape.chain(K), 1024
    decoder = SpecDecoder(plain_runtime(target, max_len + K + 8), EagleProposer(draft, shape, max_len))
    eos = {target.tokenizer.eos_token_id}

    def generate(job, on_tokens):
        return decoder.generate(
            job.prompt_ids,
            job.max_tokens,
            eos,
            temperature=job.temperature,
            top_p=job.top_p,
            seed=job.seed,
            on_tokens=on_tokens,
        )[1]

    srv = SpecServer(generate, target.tokenizer, "smol", 256, max_len, eos=eos, draft_depth=shape.num_steps)
    httpd = serve(srv, "127.0.0.1", PORT)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{PORT}", draft_dir
    httpd.shutdown()
    httpd.server_close()


def test_eaglewire_server_is_healthy_under_the_probe(served):
    from eaglewire.cli.app import app
    from eaglewire.doctor.live import snapshot

    url, draft_dir = served
    before = snapshot(url)
    assert before.engine == "eaglewire" and before.k == K  # k read from the server before any request
    r = CliRunner().invoke(
        app,
        [
            "doctor",
            "live",
            "--url",
            url,
            "--draft",
            str(draft_dir),
            "--limit",
            "2",
            "--max-tokens",
            str(MAX_TOKENS),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output[r.output.index("{") :])
    assert rep["verdict"] == "healthy" and rep["engine"] == "eaglewire" and rep["k"] == K, rep
    # the same engine and runtime on the same prompts: the server's counters equal our prediction
    assert rep["measured"]["tau"] == pytest.approx(rep["predicted"]["tau"], abs=1e-3), rep
    assert rep["measured"]["per_position"] == pytest.approx(rep["predicted"]["per_position"], abs=1e-3), rep
    assert rep["measured"]["drafts"] > 0 and len(rep["measured"]["per_position"]) == K
    assert rep["lossless"]["identical"] == 2 and rep["lossless"]["same_template"], rep["lossless"]


def test_watch_rings_when_tau_falls_below_the_threshold(served):
    """One-shot watch over real traffic: no alarm at a threshold of 1.0, an alarm (exit 1) at 4.0 > any tau
    a k=3 chain can reach."""
    from eaglewire.doctor.live import chat, served_model, snapshot
    from eaglewire.doctor.watch import watch

    url, _ = served
    model = served_model(url)
    traffic = lambda _s: chat(url, model, [{"role": "user", "content": "Name three rivers."}], 48)  # noqa: E731
    ok = watch(lambda: snapshot(url), 1.0, 0, 1, min_drafts=5, one_shot=True, sleep=traffic)
    assert [x.state for x in ok.readings] == ["ok"] and not ok.alarmed
    bad = watch(lambda: snapshot(url), 4.0, 0, 2, min_drafts=5, one_shot=True, sleep=traffic)
    assert [x.state for x in bad.readings] == ["alarm"] and bad.alarmed  # stopped at the first alarm
    from eaglewire.cli.app import app

    r = CliRunner().invoke(app, ["doctor", "watch", "--url", url, "--interval", "0", "--iterations", "1", "--once"])
    assert r.exit_code == 0 and "QUIET" in r.output, r.output  # no traffic: a quiet window, not an alarm
