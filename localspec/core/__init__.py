"""Pure numpy: sampling, verification, modes, drafters, the loop and its events (no llama_cpp)."""
