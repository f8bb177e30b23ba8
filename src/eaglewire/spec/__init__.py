"""Speculative decoding: lean target runtime, tree drafting and verification, the engine."""
