"""Draft training: training-time test (TTT), the loop, its resumable state, and distribution."""
