"""Modules that vLLM's own process imports (through PYTHONPATH set to this directory by our client).

They import vllm, which eaglewire's venv does not have: nothing in eaglewire imports them. They are
plain files here so that they ship with the package; the client points vLLM at this directory.
"""
