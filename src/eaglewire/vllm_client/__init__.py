"""vLLM driven as a client from its own venv (its CPU build): start its OpenAI server, regenerate data
through it, serve our exports, read its speculative-decoding counters.

    server.py    VllmServer (free port, bounded start, always stopped), completions, /metrics counters
    plugins/     modules vLLM's own process imports (the CPU hidden-state connector); eaglewire never does
"""
