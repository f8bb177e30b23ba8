"""Real llama.cpp (llama-server, built from the llama-cpp-python sdist by scripts/llamacpp_build.sh) serves the
embedded target (f32, llama.cpp's own conversion of the cached float target) with our released EAGLE-3 draft as
a GGUF: greedy output equal to its own plain greedy output, acceptance equal to our engine's on the same prompts
at the same precision, and the seeds' wiring faults served as llama.cpp serves them: silently, tau down.

The healthy GGUF draft is our own `export --format llamacpp`; the faulty ones are llama.cpp's own converter run
on a vLLM export with wrong ids (convert_hf_to_gguf.py --target-model-dir), how another tool's draft reaches
llama.cpp (tests/export/test_llamacpp_converter.py holds our GGUF equal to the converter's). Locally a missing
build skips these tests with the command to build it; in CI (CI=true) its absence is a failure. One thread per
server (the machine's other tests keep running) and few tokens: this checks wiring, never speed.
"""

from __future__ import annotations

import json
import shutil

import pytest

from eaglewire.serve.llamacpp import LlamaServer, convert_hf
from llamacpp_gguf import need_llama_server

pytestmark = pytest.mark.real_target

need_llama_server()

MAX_NEW, K = 48, 3
TAU_TOL, FIRST_TOL = 0.15, 0.1  # as for vLLM (tests/vllm_client/test_vllm_client.py): two fp32 kernels


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Target, released draft, our vLLM export of it, 3 MT-bench prompts, the target's HF dir and its f32 GGUF."""
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.serve.bench import bench_prompts
    from eaglewire.serve.llamacpp import target_gguf
    from eaglewire.target.loader import load_target, resolve_target

    target = load_target()
    draft = load_checkpoint(resolve_draft(None), target=target)
    export = export_draft(draft, draft.contract, tmp_path_factory.mktemp("vllm") / "vllm", "vllm")
    return target, draft, export, bench_prompts(target, "mtbench", 3), resolve_target(None)[1], target_gguf("f32")


def _gguf(setup, export_dir, out):
    """llama.cpp's converter on a vLLM-layout export, the target's HF dir giving the tokenizer."""
    return convert_hf(export_dir, out, "f32", target_dir=setup[4])


def _strip(ids, eos):
    return ids[: ids.index(eos) + 1] if eos in ids else ids


@pytest.fixture(scope="module")
def plain_ids(setup):
    """llama.cpp's own plain greedy completions of the prompts (the reference a speculative server must equal)."""
    with LlamaServer(setup[5], threads=1) as srv:
        out = [srv.complete(p[0].tolist(), MAX_NEW) for p in setup[3]]
        assert srv.counters().drafts == 0 and all(c.draft_n == 0 for c in out)  # no draft, no speculative rounds
    return [c.tokens for c in out]


@pytest.fixture(scope="module")
def ours(setup):
    from spec_reference import our_acceptance

    return our_acceptance(setup[0], setup[1], setup[3], MAX_NEW, K)


def _serve(setup, draft_gguf):
    """Serve the draft at k=K; (greedy ids, the server's counters, the requests' timings summed)."""
    with LlamaServer(setup[5], draft_gguf, n_max=K, threads=1) as srv:
        out = [srv.complete(p[0].tolist(), MAX_NEW) for p in setup[3]]
        counters = srv.counters()
    timings = (sum(c.draft_n for c in out), sum(c.draft_n_accepted for c in out))
    return [c.tokens for c in out], counters, timings


@pytest.fixture(scope="module")
def healthy(setup, tmp_path_factory):
    """Our own `export --format llamacpp` of the released draft (its vocabulary from the f32 target GGUF)."""
    from eaglewire.export.convert import export_draft

    out = export_draft(
        setup[1], setup[1].contract, tmp_path_factory.mktemp("gguf") / "llamacpp", "llamacpp", vocab_from=setup[5]
    )
    return _serve(setup, out / "draft.gguf")


def test_llamacpp_serves_our_eagle3_draft_losslessly_with_our_acceptance(setup, plain_ids, ours, healthy):
    eos = setup[0].tokenizer.eos_token_id
    ids, c, (draft_n, draft_n_accepted) = healthy
    assert [_strip(t, eos) for t in ids] == [_strip(t, eos) for t in plain_ids]  # lossless in the real engine
    same_as_ours = sum(_strip(a, eos) == _strip(b, eos) for a, b in zip(plain_ids, ours[0]))
    assert same_as_ours >= 2, "llama.cpp's f32 greedy should follow our fp32 greedy on most prompts"
    # its counters and its per-request timings are one count (the server adds a request's when it ends)
    assert c.drafts > 0 and c.k == K and (c.draft_tokens, c.accepted) == (draft_n, draft_n_accepted)
    print(
        f"\nllama.cpp f32 k={K}: tau {c.tau:.3f} per position {c.per_position}; ours tau {ours[1]:.3f} "
        f"per position {ours[2]}"
    )
    assert abs(c.tau - ours[1]) < TAU_TOL, (c.to_dict(), ours[1:])
    assert abs(c.per_position[0] - ours[2][0]) < FIRST_TOL, (c.to_dict(), ours[2])


def _with_ids(export, out, ids):
    """A copy of the vLLM export whose config names other layer ids (what a wrong export writes)."""
    shutil.copytree(export, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = list(ids)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _target_layers(path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = next(f for name, f in reader.fields.items() if name.endswith(".target_layers"))
    return [int(field.parts[i][0]) for i in field.data]


@pytest.mark.parametrize("fault", ["embedding tap", "sglang-numbered ids", "one state"])
def test_the_seeds_wiring_faults_are_served_silently_by_llamacpp(setup, plain_ids, healthy, tmp_path, fault):
    """Each fault converts without a word and llama-server serves it: output still lossless (verification is
    the target's), the draft fed other states. Ids: the embedding tapped ([0, 2, 15]: llama.cpp's id i is the INPUT
    of layer i, so 0 is the embedding; tau collapses), SGLang's numbering of our taps read as llama.cpp's (each tap
    one layer early: other per-position counts, tau about the same for this draft, as in vLLM where it measured
    1.73 -> 1.68; the doctor's static check is what names it),
    one state (every id L-3: one state three times, what a draft fed a single state sees; id L itself would
    read a state a llama target never sets)."""
    from eaglewire.contract import to_engine

    target, draft = setup[0], setup[1]
    L = target.num_layers
    ids = {
        "embedding tap": (0, 2, 15),
        "sglang-numbered ids": to_engine(draft.contract.taps, "sglang-plus1", L),
        "one state": (L - 3,) * 3,
    }[fault]
    gguf_path = _gguf(setup, _with_ids(setup[2], tmp_path / "export", ids), tmp_path / "draft.gguf")
    assert _target_layers(gguf_path) == list(ids)  # kept as written: nothing in llama.cpp objects
    got, c, _ = _serve(setup, gguf_path)
    eos = target.tokenizer.eos_token_id
    assert [_strip(t, eos) for t in got] == [_strip(t, eos) for t in plain_ids]
    healthy_tau = healthy[1].tau
    print(
        f"\n{fault} {list(ids)}: llama.cpp tau {c.tau:.3f} (healthy {healthy_tau:.3f}), per position {c.per_position}"
    )
    assert c.drafts > 0 and c.accepted_per_pos != healthy[1].accepted_per_pos  # other states reached the draft
    if fault != "sglang-numbered ids":
        assert c.tau < healthy_tau - 0.2, (fault, c.to_dict(), healthy_tau)


def test_ids_the_converter_cannot_find_default_silently(setup, tmp_path):
    """Our SGLang export nests its ids (eagle_config); llama.cpp's converter reads only the top-level key and
    silently writes its default [2, n//2, n-3] — here equal to the released draft's taps by coincidence (so
    served, it would measure the healthy tau), wrong for any other taps. Shown on a vLLM export whose ids are
    not the default and whose key is removed: the GGUF says [2, 15, 27], not what the draft was trained on."""
    L = setup[0].num_layers
    export = _with_ids(setup[2], tmp_path / "export", (3, 16, 28))
    cfg = json.loads((export / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (export / "config.json").write_text(json.dumps(cfg))
    assert _target_layers(_gguf(setup, export, tmp_path / "draft.gguf")) == [2, L // 2, L - 3]
