"""Speculative decoding on torch alone: the target's verify forward, tree drafting and verification, the engine.

    runtime.py      the Runtime protocol and StaticRuntime (Llama-family targets, static KV cache, tree masks)
    hf_runtime.py   HFRuntime: transformers' own forward for any other architecture (same tokens, slower)
    layers.py       how a runtime reads a loaded HF model's layers (Dense: the plain GEMM)
    tree.py         tree shapes (SGLang's and vLLM's knobs, DEFAULT_TREE), masks, acceptance
    propose.py      the Proposer protocol and EagleProposer       engine.py   SpecDecoder, SpecStats (tau, once)

The CPU acceleration layer is eaglewire.fastcpu; the benchmark and the server are eaglewire.serve.
"""
