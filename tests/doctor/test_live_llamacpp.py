"""`eaglewire doctor live --url` on a real llama-server (scripts/llamacpp_build.sh): the released draft served as a
GGUF (llama.cpp's own converter on our vLLM export) is judged healthy, its answers the target's own, with the
counters read from `llamacpp:*` and the per-request `timings` agreeing with them; the same draft with the
embedding tapped is judged below expectation at the first position. Locally a missing build skips; in CI
(CI=true) it fails."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from eaglewire.serve.llamacpp import LlamaServer, convert_hf
from llamacpp_gguf import need_llama_server

pytestmark = pytest.mark.real_target

need_llama_server()


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """(target f32 GGUF, released draft dir, healthy draft GGUF, embedding-tap draft GGUF)."""
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.serve.llamacpp import target_gguf
    from eaglewire.target.loader import load_target, resolve_target

    target, target_dir = load_target(), resolve_target(None)[1]
    d = tmp_path_factory.mktemp("live-llamacpp")
    draft_dir = resolve_draft(None)
    draft = load_checkpoint(draft_dir, target=target)
    export = export_draft(draft, draft.contract, d / "vllm", "vllm")
    broken = d / "embedding-tap"
    shutil.copytree(export, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 2, 15]
    (broken / "config.json").write_text(json.dumps(cfg))
    return (
        target_gguf("f32"),
        draft_dir,
        convert_hf(export, d / "ok.gguf", "f32", target_dir),
        convert_hf(broken, d / "bad.gguf", "f32", target_dir),
    )


def _live(url, draft_dir):
    from eaglewire.cli.app import app

    r = CliRunner().invoke(
        app, ["doctor", "live", "--url", url, "--draft", str(draft_dir), "--limit", "2", "--max-tokens", "32", "--json"]
    )
    assert r.exit_code in (0, 1), r.output + repr(r.exception)
    return json.loads(r.output[r.output.index("{") :])


@pytest.mark.parametrize("which", ["healthy", "embedding tap"])
def test_doctor_live_reads_llama_server(ggufs, which):
    target, draft_dir, ok, bad = ggufs
    with LlamaServer(target, ok if which == "healthy" else bad, n_max=3, threads=1) as srv:
        rep = _live(srv.url, draft_dir)
    m = rep["measured"]
    print(f"\n{which}: {rep['verdict']} — {rep['message']}")
    assert rep["engine"] == "llamacpp" and rep["k"] == 3 and m["drafts"] > 0
    # llama-server's counters and its answers' own timings are one count
    assert m["request_timings"] == {"draft_n": m["draft_tokens"], "draft_n_accepted": m["accepted"]}
    assert rep["lossless"]["same_template"], rep["lossless"]
    if which == "healthy":
        assert rep["verdict"] == "healthy" and rep["lossless"]["identical"] >= 1, rep
    else:
        assert rep["verdict"] == "below_expectation" and rep["low_positions"][0]["position"] == 0, rep
