"""The only code that imports llama_cpp: models, the compute thread, weight placement, pair checks."""
