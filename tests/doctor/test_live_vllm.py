"""`eaglewire doctor live` against real vLLM (its CPU build): one OpenAI server per draft.

The released draft's vLLM export served healthy, and served with its tap list shifted by one slot (ids
[0, 2, 15]: the embedding shifted in, the last tap dropped; the wiring fault of the doctor's results table).
The user's draft is the healthy one in both runs: the draft is right, the engine is not. The healthy export is
served by the session's compiled server (tests/conftest.py `released_vllm_speculator`, shared with
tests/vllm_client/test_vllm_client.py), the broken one by an eager server of its own. The healthy server is
found healthy with vLLM's tau within TOLERANCE of our engine's prediction on the same prompts (fp32 both:
the margin covers the rare greedy divergence between two fp32 kernels); the broken one is below expectation,
the first position pointed at (the wiring). Our prediction is computed once for both.

vLLM lives in its own venv (scripts/vllm_venv.sh; .ci/run builds it): skipped locally without it, a failure
in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from eaglewire.vllm_client.server import BUILD_HINT, VllmServer, vllm_available

pytestmark = pytest.mark.real_target

if not vllm_available():
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI must build vLLM's CPU build: " + BUILD_HINT)
    pytest.skip("vLLM's CPU build is not installed: " + BUILD_HINT, allow_module_level=True)

K, MAX_TOKENS, LIMIT = 3, 48, 3
TOLERANCE = 0.15  # |vLLM tau - our predicted tau| on the same prompts, as tests/vllm_client/test_vllm_client.py allows
BROKEN_IDS = [0, 2, 15]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from eaglewire.cli.doctor_live import _chats
    from eaglewire.decoding.tree import TreeShape
    from eaglewire.doctor.live import reference
    from eaglewire.export.checkpoint import load_checkpoint, resolve_draft
    from eaglewire.export.convert import export_draft
    from eaglewire.target.loader import load_target, resolve_target

    target = load_target()
    draft = load_checkpoint(resolve_draft(None), target=target)
    root = tmp_path_factory.mktemp("live-vllm")
    healthy = export_draft(draft, draft.contract, root / "healthy", "vllm")
    broken = root / "broken"
    shutil.copytree(healthy, broken)
    (broken / "eaglewire_contract.json").unlink()  # a hand-edited config: nothing else says otherwise
    cfg = json.loads((broken / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = BROKEN_IDS
    (broken / "config.json").write_text(json.dumps(cfg))
    chats = _chats("mtbench", LIMIT)
    ref = reference(target, draft, draft.contract, TreeShape.chain(K), chats, MAX_TOKENS)
    return resolve_target(None)[1], healthy, broken, chats, ref


def _probe(setup, served):
    """One server for `served` (k=K, fp32, one sequence at a time, eager: no compile), probed once."""
    target_dir = setup[0]
    spec = {"method": "eagle3", "model": str(served), "num_speculative_tokens": K}
    with VllmServer(target_dir, dtype="float32", speculative_config=spec, max_num_seqs=1, enforce_eager=True) as srv:
        return _probe_running(setup, srv)


def _probe_running(setup, srv):
    """`doctor live`'s probe of a running server: its counters over these requests only (a window: before and
    after them), compared with our prediction."""
    from eaglewire.doctor.live import compare, probe_engine

    _target_dir, healthy, _broken, chats, ref = setup
    window = probe_engine(srv.base_url, chats, MAX_TOKENS)  # engine detected from its /metrics
    return window, compare(window, ref, K, str(healthy), None)


def test_vllm_serving_the_healthy_export_is_healthy(setup, released_vllm_speculator):
    """The healthy export on the session's compiled EAGLE-3 server (tests/conftest.py; test_vllm_client.py serves
    the same): the released draft's vLLM export, the same export_draft call as `setup`'s healthy one."""
    srv, served = released_vllm_speculator
    assert srv.speculative_config["num_speculative_tokens"] == K and srv.dtype == "float32"  # what this test served
    assert _same_files(served, setup[1])
    with srv.resumed():
        window, rep = _probe_running(setup, srv)
    print("healthy:", rep.measured, rep.predicted, rep.lossless)
    assert window.counters.engine == "vllm" and window.counters.k == K  # k read from vLLM's own series
    assert rep.verdict == "healthy", rep.to_dict()
    assert abs(rep.measured["tau"] - rep.predicted["tau"]) < TOLERANCE, rep.to_dict()
    assert rep.measured["draft_tokens"] == K * rep.measured["drafts"]
    assert rep.lossless["same_template"] and rep.lossless["identical"] >= LIMIT - 1, rep.lossless


def _same_files(a, b) -> bool:
    """Whether two export directories hold the same files, byte for byte."""
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def test_vllm_serving_taps_shifted_by_one_is_below_expectation_at_the_wiring(setup):
    window, rep = _probe(setup, setup[2])
    print("broken:", rep.measured, rep.predicted, rep.lossless)
    assert rep.verdict == "below_expectation", rep.to_dict()
    assert rep.low_positions and rep.low_positions[0]["position"] == 0
    assert "taps" in rep.points_at and "eaglewire doctor check" in rep.next_command
    assert rep.lossless["identical"] >= LIMIT - 1  # wrongly wired, still lossless: only speed is lost
