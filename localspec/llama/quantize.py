"""Derive a smaller-precision GGUF from a larger one with llama.cpp's own quantizer (the demo pairs)."""

from __future__ import annotations

import ctypes
from pathlib import Path

from localspec.core.errors import ModelError
from localspec.llama.runtime import C, log

_FTYPES = {
    "F32": "LLAMA_FTYPE_ALL_F32",
    "F16": "LLAMA_FTYPE_MOSTLY_F16",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "Q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    # with ``pure``, every matrix in that one type (the kernel tests)
    "Q4_K": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "Q5_K": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
}


def quantize(source: Path, destination: Path, kind: str, threads: int = 0, pure: bool = False) -> None:
    """Convert a GGUF to another weight type with ``llama_model_quantize`` (requantizing allowed).

    ``pure``: every matrix in ``kind``, the output matrix included. Otherwise llama.cpp keeps some at a
    higher precision: the Qwen2.5 0.5B's output matrix stays Q8_0, 145 of the 352 MB a draft token
    reads; in Q4_0 a token costs 12 % less at an acceptance within 0.4 % (docs/performance.md).
    """
    if kind not in _FTYPES:
        raise ModelError(f"weight type {kind!r} is not supported; use one of {', '.join(_FTYPES)}")
    params = C.llama_model_quantize_default_params()
    params.ftype = getattr(C, _FTYPES[kind])
    params.allow_requantize = True
    params.pure = pure
    params.nthread = threads
    log().lines.clear()
    code = C.llama_model_quantize(str(source).encode(), str(destination).encode(), ctypes.byref(params))
    if code != 0:
        detail = log().last_error()
        raise ModelError(f"converting {source.name} to {kind} failed" + (f" (llama.cpp: {detail})" if detail else ""))
