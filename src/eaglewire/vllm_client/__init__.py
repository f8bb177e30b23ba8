"""vLLM driven as a client from its own venv (its CPU build): start its OpenAI server, regenerate data
through it, serve our exports, read its speculative-decoding counters.

    server.py    VllmServer (bounded start, pause, always stopped), completions, /metrics counters
    process.py   a served engine's process group: free port, parent-death and watchdog, SIGSTOP reached
    plugins/     modules vLLM's own process imports (the CPU hidden-state connector); eaglewire never does
"""
