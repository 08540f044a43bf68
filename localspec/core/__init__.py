"""Pure numpy, the exact part: sampling, verification, modes, the loop, its events and the protocols it asks
its drafting policy through (no llama_cpp, no speed policy: see localspec.drafting)."""
