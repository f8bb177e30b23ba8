"""The product surfaces of speculative decoding: what a user runs and measures (decoders assembled by
eaglewire.compose: the runtime, fastcpu where installed, and the drafter).

    bench.py     the interleaved benchmark: vanilla, prompt lookup, EAGLE-3 chain and tree, one process
    bench_rows.py  ... its row names and defaults (the CLI's and the run config's)
    bench_summary.py  ... what its runs add up to (speedups, tau, round costs) and its files: json, table, plot
    server.py    the OpenAI-compatible server (127.0.0.1) with speculative decoding: its HTTP side
    worker.py    ... and its model side: the job queue, the one worker thread owning the engine, metrics
    start.py     ... and its start: the runtime and decoder built for a loaded draft, on a bound socket
    peer.py      the same questions through vLLM's CPU build, for side-by-side rows
"""
