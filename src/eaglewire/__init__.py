"""eaglewire: train EAGLE-3 drafts, export them with proven wiring, run and measure speculative decoding."""

__version__ = "0.1.0"
