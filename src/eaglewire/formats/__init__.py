"""Draft checkpoint formats of the engines: SGLang, vLLM/speculators, SafeAILab EAGLE, SpecForge."""
