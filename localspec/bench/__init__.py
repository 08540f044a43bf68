"""Benchmarks: ``python -m localspec.bench sampler`` (verification step) and ``localspec bench`` (end to end)."""
