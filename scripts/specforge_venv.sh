#!/usr/bin/env bash
# A second venv with the real SpecForge package, used by tests/export/test_real_clients.py to load our SpecForge and
# SGLang exports the way SpecForge warm-starts an EAGLE-3 draft (its own config resolver, builder, weight
# loader and LlamaForCausalLMEagle3) and compare its logits with ours, on CPU.
#   bash scripts/specforge_venv.sh && export EAGLEWIRE_SPECFORGE_PYTHON=~/.cache/eaglewire/client-venvs/specforge/bin/python
# The venv lives in the user cache (a third-party tree does not belong in the repository).
# specforge 0.2.0 pins torch==2.11.0 and sglang==0.5.14 (CUDA builds, GBs; sglang is only its capture
# server), so it is installed with --no-deps and only what the draft-model path imports is added.
set -euo pipefail
DEFAULT="${EAGLEWIRE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eaglewire}/client-venvs/specforge"
V="${1:-$DEFAULT}"
python3 -m venv "$V"
# The CPU wheel on local disk (the same torch as eaglewire's venv); any other version pulls a CUDA build.
"$V/bin/pip" install -q torch==2.13.0
# transformers: the exact version specforge 0.2.0 pins (its draft model and loaders work with it on torch 2.13).
# safetensors / huggingface_hub: imported by its draft base class; pydantic: its run-config schema
# (specforge.config), through which the trainer's draft builder is driven.
"$V/bin/pip" install -q "transformers==5.8.1" safetensors huggingface_hub pydantic
# The model code itself, without its CUDA/serving dependency pins (torch 2.11, sglang, yunchang, wandb, ...).
"$V/bin/pip" install -q --no-deps specforge==0.2.0
