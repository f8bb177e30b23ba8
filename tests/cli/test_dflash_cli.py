"""A DFlash draft directory goes where an EAGLE-3 one does: `generate`, `bench --methods ...,dflash` and the
server decode with it (its proposer from the family registry), token for token the target's greedy output."""

import json
import threading

import torch
from test_server import _post, _tiny_target_dir
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.decoding.engine import greedy_reference
from eaglewire.decoding.runtime import StaticRuntime
from eaglewire.draft.dflash import build_dflash_draft
from eaglewire.draft.dflash_contract import dflash_contract, pick_mask_token
from eaglewire.export.checkpoint import load_checkpoint, save_checkpoint
from eaglewire.families import BlockWiring
from eaglewire.target.loader import load_target


def _setup(tmp_path):
    tdir = _tiny_target_dir(tmp_path)
    target = load_target(str(tdir))
    block = BlockWiring(block_size=4, mask_token_id=pick_mask_token(target.tokenizer))
    draft = build_dflash_draft(target, dflash_contract(target, (1, 2, 3, 4), block), num_layers=1)
    save_checkpoint(draft, draft.contract, tmp_path / "dflash")
    return tdir, target, tmp_path / "dflash"


def _greedy(target, msgs, n):
    ids = target.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True, return_tensors="pt")[
        "input_ids"
    ]
    return greedy_reference(StaticRuntime(target, max_len=256), ids, n, eos={target.tokenizer.eos_token_id})


def test_generate_bench_and_serve_take_a_dflash_draft(tmp_path):
    tdir, target, ddir = _setup(tmp_path)
    r = CliRunner().invoke(
        app,
        [
            "generate",
            "--target",
            str(tdir),
            "--draft",
            str(ddir),
            "-p",
            "Hi.",
            "--json",
            "--max-new-tokens",
            "10",
            "--draft-dtype",
            "target",
            "--compile",
            "never",
        ],
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    out = json.loads(r.stdout)
    assert out["tokens"] == _greedy(target, [{"role": "user", "content": "Hi."}], 10)
    assert len(out["stats"]["per_position"]) == 3  # B-1 drafts per round

    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "\n".join(
            json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": q}]})
            for i, q in enumerate(["Name a colour.", "Count to five."])
        )
    )
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "--target",
            str(tdir),
            "--draft",
            str(ddir),
            "--dflash-draft",
            str(ddir),
            "--questions",
            str(questions),
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--methods",
            "vanilla,dflash",
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    result = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert result["methods"]["dflash"]["matches_vanilla"] == 2 and result["block"]["num_steps"] == 3
    assert len(result["methods"]["dflash"]["per_position"]) == 3
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "--target",
            str(tdir),
            "--draft",
            str(ddir),
            "--questions",
            str(questions),
            "--methods",
            "vanilla,dflash",
            "--out",
            str(tmp_path / "c"),
        ],
    )
    assert r.exit_code != 0 and "--dflash-draft" in r.output + str(r.exception)


def test_server_decodes_with_a_dflash_draft(tmp_path):
    from eaglewire.compose import proposal_shape
    from eaglewire.serve.start import build_server

    _, target, ddir = _setup(tmp_path)
    draft = load_checkpoint(ddir, target=target)
    httpd = build_server(
        target, draft, proposal_shape(draft.contract, None), "tiny", 128, 32, "127.0.0.1", 0, log=lambda _: None
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        msgs = [{"role": "user", "content": "Say something."}]
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions"
        status, body = _post(url, {"model": "tiny", "messages": msgs, "max_tokens": 12})
        assert status == 200, body
        text = json.loads(body)["choices"][0]["message"]["content"]
        assert text == target.tokenizer.decode(_greedy(target, msgs, 12), skip_special_tokens=True)
    finally:
        httpd.shutdown()
    assert torch.equal(draft.fc.weight, load_checkpoint(ddir, target=target).fc.weight)


def test_export_writes_a_dflash_draft_in_every_block_format_and_names_its_ids(tmp_path):
    """`eaglewire export` of a DFlash draft: each of its formats is written, the summary line names the config
    field and the ids in that format's numbering (an EAGLE-3 engine record used to be looked up for it, and
    the command failed after writing), and the export reads back to the same contract."""
    from eaglewire.export.block_import import import_block_draft

    tdir, target, _ = _setup(tmp_path)
    block = BlockWiring(block_size=4, mask_token_id=pick_mask_token(target.tokenizer))
    draft = build_dflash_draft(target, dflash_contract(target, (1, 2, 3), block), num_layers=1)  # zlab: no final tap
    save_checkpoint(draft, draft.contract, tmp_path / "d3")
    ddir = tmp_path / "d3"
    for fmt, field in (
        ("zlab", "dflash_config.target_layer_ids"),
        ("sglang", "dflash_config.target_layer_ids"),
        ("vllm", "aux_hidden_state_layer_ids"),
        ("speculators", "aux_hidden_state_layer_ids"),
    ):
        out = tmp_path / f"x-{fmt}"
        r = CliRunner().invoke(app, ["export", str(ddir), "--format", fmt, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert f"{fmt} export -> " in r.output and field in r.output.replace("\n", ""), r.output
        _, back = import_block_draft(out, fmt, target=target)
        assert back.taps == draft.contract.taps and back.block == draft.contract.block
