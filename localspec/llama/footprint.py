"""What a loaded model takes in memory, and where: its weights, its KV cache and its compute buffer, on the GPUs
it offloads to and on the CPU, read from the GGUF's tensor table by llama.cpp's rules (tests/test_models.py checks
them against the sizes llama.cpp logs)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when used: this module's Footprint is read without loading llama.cpp
    from localspec.llama.placement import Offload

KV_BYTES = 2  # llama.cpp's default cache type, F16
ACTIVATION_BYTES = 4  # float32
CONTEXT_STEP = 256  # llama.cpp rounds a context up to a multiple of this


@dataclass(frozen=True)
class Footprint:
    """Bytes in one kind of memory (a GPU's, or the CPU's)."""

    weights: int = 0
    kv_cache: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def footprint(
    path: Path | str, n_ctx: int, n_batch: int, offload: Offload | None = None
) -> tuple[Footprint, Footprint]:
    """(on the GPUs, on the CPU) for ``path`` loaded with a context of ``n_ctx`` tokens and batches of ``n_batch``.

    Weights: each tensor where the split puts it (the token embeddings stay on the CPU); the copies the CPU's
    extra buffers make of some (CPU_REPACK, AMX) are not counted. KV cache: per cached
    token, each block's K and V projection rows in F16, kept with the block (llama.cpp offloads a block's cache
    with it). Compute buffer: a batch's logits and its widest activation (the FFN's) in float32, where the
    output layer is; the rest of the graph reuses that memory. A file ggml cannot read takes nothing here:
    its load says why.
    """
    from localspec.llama.placement import CPU_ONLY
    from localspec.llama.runtime import gguf_tensor_table

    offload = offload or CPU_ONLY
    table = gguf_tensor_table(str(path))
    n_ctx = -(-n_ctx // CONTEXT_STEP) * CONTEXT_STEP
    n_batch = min(n_batch, n_ctx)
    weights, kv_cache = {True: 0, False: 0}, {True: 0, False: 0}  # by "stays on the CPU"
    rows = {}
    for name, _kind, _dims, n_rows, size in table:
        here = offload.on_cpu(name)
        weights[here] += size
        if name.endswith((".attn_k.weight", ".attn_v.weight")):
            kv_cache[here] += n_rows * n_ctx * KV_BYTES
        rows[name] = n_rows
    vocabulary, ffn = rows.get("token_embd.weight", 0), rows.get("blk.0.ffn_up.weight", 0)
    compute = n_batch * (vocabulary + ffn) * ACTIVATION_BYTES if table else 0
    output_here = offload.on_cpu("output.weight")
    return (
        Footprint(weights[False], kv_cache[False], 0 if output_here else compute),
        Footprint(weights[True], kv_cache[True], compute if output_here else 0),
    )
