"""Speculative decoding: lean target runtime, tree drafting and verification, the engine.

    runtime.py / hf_runtime.py   the target's verify forward (lean; transformers fallback)
    tree.py      tree shapes (SGLang's and vLLM's knobs, DEFAULT_TREE), masks, acceptance
    propose.py   the Proposer protocol and EagleProposer     engine.py   SpecDecoder, SpecStats (tau, once)
    bench.py     the interleaved benchmark                   server.py   the OpenAI-compatible server
"""
