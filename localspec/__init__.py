"""localspec: exact speculative decoding for local GGUF models through llama.cpp."""

__version__ = "0.1.0"
