"""Real engines driven as clients from their own venvs (vLLM's CPU build): serve, regenerate, measure."""
