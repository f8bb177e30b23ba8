# aot_start.py MODE...: one start of the embedded target's vLLM server per MODE, back to back, 16 greedy tokens each.
# MODE: aot0 (compiled, VLLM_USE_AOT_COMPILE=0), aot1 (compiled, =1: vLLM's default under torch 2.13), eager.
# (run as: nice -n 10 python benchmarks/results/ci/2026-12-07-epyc-avx512/aot_start.py aot0 aot0 aot1 eager)
import sys
import time

from eaglewire.target.loader import resolve_target
from eaglewire.vllm_client.server import VllmServer, complete_ids

d = resolve_target(None)[1]
for mode in sys.argv[1:]:
    env = {"VLLM_USE_AOT_COMPILE": "1" if mode == "aot1" else "0"}
    t = time.monotonic()
    with VllmServer(d, dtype="float32", env=env, enforce_eager=mode == "eager", nice=0, startup_timeout=1800) as srv:
        t1 = time.monotonic()
        ids = complete_ids(srv.base_url, srv.model_name, [1, 2, 3, 4], 16)
        t2 = time.monotonic()
    log = srv.log_path.read_text(errors="replace")
    notes = [
        n
        for n in (
            "Compiling model again",
            "Directly load",
            "Using cache directory",
            "loading from cache",
            "Cache the graph",
            "Compiling a graph",
        )
        if n in log
    ]
    print(f"{mode}: ready {t1 - t:.1f} s, 16 tokens {t2 - t1:.1f} s, log {srv.log_path.name} {notes} {ids}", flush=True)
