"""The target model (the verifier of speculative decoding): loading it, locating its decoder stack,
capturing tapped hidden states, and reading just the tensors a draft needs (offline training).

    loader.py    Target, load_target (embedded SmolLM2 default, local HF dirs)
    capture.py   tap hooks, boundary capture
    weights.py   TargetWeights: config + tokenizer + tensors read by name, never the whole model
"""
