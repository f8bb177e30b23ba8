"""`eaglewire doctor live --draft DIR` where DIR is a DFlash export: eaglewire's own server (real HTTP on
loopback) serves a tiny target with a DFlash draft; the probe reads its counters, decodes the same prompts
with the reference (compose.decoder, the DFlash family's block proposer) and compares per draft position
(the block's B-1 slots). A second server runs the same draft fed other taps than its export names: the
probe's reference (the export's taps) no longer matches the engine's counters position for position."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
import torch
from test_cli_pipeline import tiny_dir  # noqa: F401  (the fixture: a tiny target with the real tokenizer)
from typer.testing import CliRunner

PORTS, BLOCK, MAX_TOKENS = (18231, 18232), 4, 24
TAPS = (2, 4, 6)


@pytest.fixture(scope="module")
def dflash_export(tiny_dir, tmp_path_factory):  # noqa: F811
    """A one-layer DFlash draft trained briefly on the tiny target's own greedy continuations (its loops are
    learnable, so the draft accepts something), exported in z-lab's layout with its contract."""
    from eaglewire.capture.features import OnlineFeatures
    from eaglewire.data.samples import Sample
    from eaglewire.draft.dflash_contract import dflash_contract
    from eaglewire.export.checkpoint import load_checkpoint
    from eaglewire.export.convert import export_draft
    from eaglewire.families import BlockWiring
    from eaglewire.target.loader import load_target
    from eaglewire.train.loop import TrainConfig, train

    target = load_target(str(tiny_dir))
    contract = dflash_contract(target, TAPS, BlockWiring(BLOCK, target.vocab_size - 1))
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 2000, (64, 8), generator=g)
    with torch.no_grad():
        text = target.model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=40,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )  # [64, 48]
    mask = torch.zeros(text.shape[1], dtype=torch.long)
    mask[8:] = 1
    samples = [Sample(id=f"g{i}", input_ids=t, loss_mask=mask) for i, t in enumerate(text)]
    c = TrainConfig(
        family="dflash",
        block_size=BLOCK,
        anchors=8,
        max_steps=150,
        batch_size=8,
        lr=3e-3,
        warmup_steps=5,
        eval_every=10_000,
        ckpt_every=10_000,
        num_layers=1,
        loss="forward_kl",
        dtype="fp32",
    )
    run = tmp_path_factory.mktemp("dflash")
    train(target, contract, None, OnlineFeatures(target, contract, pad_id=0), samples[:-4], samples[-4:], c, run)
    draft = load_checkpoint(run / "draft", target=target)
    return target, draft, contract, export_draft(draft, contract, run / "zlab", "zlab")


def _serve(target, draft, contract, port):
    from eaglewire.compose import cache_len, proposer
    from eaglewire.decoding.engine import SpecDecoder
    from eaglewire.decoding.runtime import plain_runtime
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.serve.server import SpecServer, serve

    shape, max_len = TreeShape.chain(BLOCK - 1), 512
    rt = plain_runtime(target, cache_len(max_len, shape))
    decoder = SpecDecoder(rt, proposer(draft, shape, cache_len(max_len, shape), rt, contract=contract))
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

    srv = SpecServer(generate, target.tokenizer, "tiny", 256, max_len, eos=eos, draft_depth=shape.num_steps)
    httpd = serve(srv, "127.0.0.1", port)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _live(url, draft_dir, target_dir):
    from eaglewire.cli.app import app

    r = CliRunner().invoke(
        app,
        [
            "doctor",
            "live",
            "--url",
            url,
            "--draft",
            str(draft_dir),
            "--target",
            str(target_dir),
            "--limit",
            "2",
            "--max-tokens",
            str(MAX_TOKENS),
            "--json",
        ],
    )
    return r, json.loads(r.output[r.output.index("{") :])


def test_live_probe_of_a_dflash_draft_on_eaglewire_s_server(tiny_dir, dflash_export):  # noqa: F811
    target, draft, contract, out = dflash_export
    httpd = _serve(target, draft, contract, PORTS[0])
    try:
        r, rep = _live(f"http://127.0.0.1:{PORTS[0]}", out, tiny_dir)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert rep["k"] == BLOCK - 1 and rep["engine"] == "eaglewire", rep  # k read from the server: the block's drafts
    assert rep["measured"]["drafts"] > 0 and len(rep["predicted"]["per_position"]) == BLOCK - 1
    # the same block proposer and runtime on the same prompts: the counters equal the reference's figures
    assert rep["measured"]["tau"] == pytest.approx(rep["predicted"]["tau"], abs=1e-3), rep
    assert rep["measured"]["per_position"] == pytest.approx(rep["predicted"]["per_position"], abs=1e-3), rep
    assert rep["measured"]["per_position"][0] > 0.1, rep  # the trained draft accepts: the figures are not all 0
    assert rep["verdict"] == "healthy" and r.exit_code == 0, rep
    assert rep["lossless"]["identical"] == 2, rep["lossless"]


def test_a_server_feeding_other_taps_differs_from_the_reference(tiny_dir, dflash_export):  # noqa: F811
    """The engine runs the draft on taps one layer early (the ids-shifted failure); the reference decodes with
    the export's: the answers stay lossless (verification is the target's), the acceptance figures differ."""
    target, draft, contract, out = dflash_export
    httpd = _serve(target, draft, replace(contract, taps=tuple(t - 1 for t in TAPS)), PORTS[1])
    try:
        _, rep = _live(f"http://127.0.0.1:{PORTS[1]}", out, tiny_dir)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert rep["lossless"]["identical"] == 2 and rep["measured"]["drafts"] > 0, rep
    assert rep["measured"]["per_position"] != pytest.approx(rep["predicted"]["per_position"], abs=1e-3), rep
    assert not torch.isnan(torch.tensor(rep["measured"]["tau"]))
