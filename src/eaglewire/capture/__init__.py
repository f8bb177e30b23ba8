"""The target's hidden states, captured: for training a draft, and as the evidence the doctor measures.

hooks.py          tap hooks on any HF decoder's boundaries (eaglewire.contract's numbering), capture files
features.py       training features: online (target inside training) or offline sharded safetensors
feature_dir.py    a feature directory on disk: its manifest checked, the shard loop that writes and resumes it
boundaries.py     every boundary of the target on built-in prompts, captured once (the measured checks)
boundary_file.py  those boundaries in one file, and a stand-in target built from it (measure without it)
identify.py       which boundary each state of a dump is, by comparison with the target's own states
vllm.py           hidden states captured through vLLM's own extraction path
dumps/            other tools' dumps (SpecForge, speculators): read, report, import as feature shards
"""
